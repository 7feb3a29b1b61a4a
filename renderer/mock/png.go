package mock

import (
	"bytes"
	"compress/zlib"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"strconv"
	"sync"

	"github.com/leasehold/leasehold/renderer"
)

// Preview geometry: a Size x Size image made of cells x cells squares.
const (
	// Size is the width and height of every preview in pixels.
	Size  = 64
	cells = 8
)

// PNG text chunk keywords stamped into every preview.
const (
	// KeyJobID is the tEXt keyword holding the job id.
	KeyJobID = "Leasehold-Job"
	// KeyToken is the tEXt keyword holding the lease token in decimal.
	KeyToken = "Leasehold-Token"
	// KeyRendererID is the tEXt keyword holding the renderer id.
	KeyRendererID = "Leasehold-Renderer"
	// KeySoftware is the standard tEXt keyword naming the producer.
	KeySoftware = "Software"
)

// software is the KeySoftware text of every preview.
const software = "leasehold mock renderer"

// pngSignature opens every PNG file.
const pngSignature = "\x89PNG\r\n\x1a\n"

// The preview is an 8-bit paletted image: the pixel indices never change
// (each cell of the grid has its own palette entry), so the compressed IDAT
// chunk is built once per process; only the palette, which carries the
// document's colours, and the text chunks are written per render. That keeps
// a render at a few microseconds and one allocation, where encoding an RGBA
// image cost about a millisecond and a megabyte.
const (
	// paletteLen is the number of palette entries: one per cell.
	paletteLen = cells * cells
	// chunkOverhead is the length, type and CRC around a chunk's data.
	chunkOverhead = 4 + 4 + 4
)

// fixedChunks holds the chunks that are the same in every preview.
type fixedChunks struct {
	// head is the signature and the IHDR chunk.
	head []byte
	// tail is the IDAT and IEND chunks.
	tail []byte
}

// fixed returns the chunks shared by every preview, built on first use.
var fixed = sync.OnceValue(func() fixedChunks {
	var ihdr [13]byte
	binary.BigEndian.PutUint32(ihdr[0:], Size)
	binary.BigEndian.PutUint32(ihdr[4:], Size)
	ihdr[8] = 8 // bit depth
	ihdr[9] = 3 // colour type: palette indices
	// compression, filter and interlace methods stay 0.
	head := appendChunk([]byte(pngSignature), "IHDR", ihdr[:])

	// Each scanline is a filter byte (0, none) and one palette index per
	// pixel: the index of the pixel's cell.
	cell := Size / cells
	raw := make([]byte, 0, Size*(Size+1))
	for y := range Size {
		raw = append(raw, 0)
		for x := range Size {
			raw = append(raw, byte((y/cell)*cells+x/cell))
		}
	}
	var z bytes.Buffer
	zw, err := zlib.NewWriterLevel(&z, zlib.BestCompression)
	if err != nil {
		panic(fmt.Sprintf("mock: zlib writer: %v", err)) // the level is a valid constant
	}
	if _, err := zw.Write(raw); err != nil {
		panic(fmt.Sprintf("mock: compressing pixels: %v", err)) // writes to a bytes.Buffer do not fail
	}
	if err := zw.Close(); err != nil {
		panic(fmt.Sprintf("mock: compressing pixels: %v", err))
	}
	tail := appendChunk(nil, "IDAT", z.Bytes())
	tail = appendChunk(tail, "IEND", nil)
	return fixedChunks{head: head, tail: tail}
})

// renderPNG draws the preview of in.Document and stamps the lease into it.
// The pixels depend only on the document (through the palette), the text
// chunks only on the lease, so the same document under the same lease always
// gives the same bytes.
func renderPNG(in renderer.Input) []byte {
	f := fixed()
	tokenText := strconv.AppendUint(make([]byte, 0, 20), in.Token, 10)
	n := len(f.head) + len(f.tail) +
		textChunkLen(KeySoftware, len(software)) +
		textChunkLen(KeyJobID, len(in.JobID)) +
		textChunkLen(KeyToken, len(tokenText)) +
		textChunkLen(KeyRendererID, len(in.RendererID)) +
		chunkOverhead + paletteLen*3
	out := make([]byte, 0, n)
	out = append(out, f.head...)
	out = appendText(out, KeySoftware, software)
	out = appendText(out, KeyJobID, in.JobID)
	out = appendText(out, KeyToken, string(tokenText))
	out = appendText(out, KeyRendererID, in.RendererID)
	out = appendPalette(out, documentSeed(in.Document))
	return append(out, f.tail...)
}

// appendPalette appends the PLTE chunk: paletteLen colours drawn from a
// generator seeded with the document's hash, so different documents get
// different colours and the same document the same ones.
func appendPalette(b []byte, seed [sha256.Size]byte) []byte {
	b = binary.BigEndian.AppendUint32(b, paletteLen*3)
	start := len(b)
	b = append(b, "PLTE"...)
	data := len(b)
	b = b[:data+paletteLen*3]
	rng := rand.NewChaCha8(seed)
	_, _ = rng.Read(b[data:]) // ChaCha8.Read never fails
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b[start:]))
}

// documentSeed hashes what the preview's pixels derive from: the content, or
// the name and source URI when there is no inline content.
func documentSeed(doc renderer.Document) [sha256.Size]byte {
	h := sha256.New()
	if len(doc.Content) > 0 {
		h.Write([]byte("content\x00"))
		h.Write(doc.Content)
	} else {
		h.Write([]byte("name\x00"))
		h.Write([]byte(doc.Name))
		h.Write([]byte("\x00uri\x00"))
		h.Write([]byte(doc.SourceURI))
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// textChunkLen is the encoded length of a tEXt chunk.
func textChunkLen(keyword string, textLen int) int {
	return chunkOverhead + len(keyword) + 1 + textLen
}

// appendText appends a PNG tEXt chunk. Keywords are fixed Latin-1 constants;
// values are written as given (job and renderer ids are ASCII).
func appendText(b []byte, keyword, text string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(keyword)+1+len(text)))
	start := len(b)
	b = append(b, "tEXt"...)
	b = append(b, keyword...)
	b = append(b, 0)
	b = append(b, text...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b[start:]))
}

// appendChunk appends a chunk of type typ around data.
func appendChunk(b []byte, typ string, data []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	start := len(b)
	b = append(b, typ...)
	b = append(b, data...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b[start:]))
}

// TextChunks returns the tEXt chunks of a PNG as a map from keyword to text.
// It returns an error when b is not a well-formed chunk sequence.
func TextChunks(b []byte) (map[string]string, error) {
	if !bytes.HasPrefix(b, []byte(pngSignature)) {
		return nil, fmt.Errorf("mock: not a PNG")
	}
	out := map[string]string{}
	for p := len(pngSignature); p < len(b); {
		if p+8 > len(b) {
			return nil, fmt.Errorf("mock: truncated chunk header at %d", p)
		}
		n := int(binary.BigEndian.Uint32(b[p:]))
		typ := string(b[p+4 : p+8])
		end := p + 8 + n + 4
		if n < 0 || end > len(b) {
			return nil, fmt.Errorf("mock: truncated %s chunk at %d", typ, p)
		}
		if crc32.ChecksumIEEE(b[p+4:p+8+n]) != binary.BigEndian.Uint32(b[p+8+n:]) {
			return nil, fmt.Errorf("mock: bad CRC in %s chunk at %d", typ, p)
		}
		if typ == "tEXt" {
			kv := b[p+8 : p+8+n]
			if i := bytes.IndexByte(kv, 0); i > 0 {
				out[string(kv[:i])] = string(kv[i+1:])
			}
		}
		p = end
	}
	return out, nil
}

// padChunk is the type of the padding chunk: ancillary (lower-case first
// letter), private (lower-case second), safe to copy; viewers skip it.
const padChunk = "lhPd"

// MaxPreviewBytes bounds Config.PreviewBytes.
const MaxPreviewBytes = 8 << 20

// pad returns img padded to n bytes with a padChunk before IEND, its data
// drawn from the document's hash and the lease, so that the bytes do not
// compress and the same render under the same lease gives the same bytes.
// An image already n bytes or longer, or too short a gap for a chunk, is
// returned as it is.
func pad(img []byte, n int, in renderer.Input) []byte {
	const iend = chunkOverhead
	if n-len(img) < chunkOverhead {
		return img
	}
	data := n - len(img) - chunkOverhead
	seed := documentSeed(in.Document)
	binary.BigEndian.PutUint64(seed[:8], binary.BigEndian.Uint64(seed[:8])^in.Token)
	out := make([]byte, 0, n)
	out = append(out, img[:len(img)-iend]...)
	out = binary.BigEndian.AppendUint32(out, uint32(data))
	start := len(out)
	out = append(out, padChunk...)
	body := len(out)
	out = out[:body+data]
	_, _ = rand.NewChaCha8(seed).Read(out[body:])
	out = binary.BigEndian.AppendUint32(out, crc32.ChecksumIEEE(out[start:]))
	return append(out, img[len(img)-iend:]...)
}
