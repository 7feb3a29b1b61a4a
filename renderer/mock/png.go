package mock

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"image"
	"image/png"
	"strconv"
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

// pngHeaderLen is the length of the PNG signature plus the IHDR chunk, after
// which the text chunks are inserted.
const pngHeaderLen = 8 + 4 + 4 + 13 + 4

// renderPNG draws the preview of in.Document and stamps the lease into it.
func renderPNG(in Input) ([]byte, error) {
	seed := documentSeed(in.Document)
	palette := make([]byte, 0, cells*cells*3)
	for i := uint32(0); len(palette) < cells*cells*3; i++ {
		var b [sha256.Size + 4]byte
		copy(b[:], seed[:])
		binary.BigEndian.PutUint32(b[sha256.Size:], i)
		sum := sha256.Sum256(b[:])
		palette = append(palette, sum[:]...)
	}
	img := image.NewNRGBA(image.Rect(0, 0, Size, Size))
	cell := Size / cells
	for y := range Size {
		for x := range Size {
			i := ((y/cell)*cells + x/cell) * 3
			// A light diagonal shade inside each cell keeps neighbouring cells
			// of similar colour apart.
			shade := uint8((x%cell + y%cell) * 2)
			o := img.PixOffset(x, y)
			img.Pix[o], img.Pix[o+1], img.Pix[o+2], img.Pix[o+3] = palette[i]^shade, palette[i+1]^shade, palette[i+2]^shade, 0xff
		}
	}
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	if err := enc.Encode(&buf, img); err != nil {
		return nil, fmt.Errorf("mock: encoding preview: %w", err)
	}
	raw := buf.Bytes()
	out := make([]byte, 0, len(raw)+256)
	out = append(out, raw[:pngHeaderLen]...)
	out = appendText(out, KeySoftware, "leasehold mock renderer")
	out = appendText(out, KeyJobID, in.JobID)
	out = appendText(out, KeyToken, strconv.FormatUint(in.Token, 10))
	out = appendText(out, KeyRendererID, in.RendererID)
	out = append(out, raw[pngHeaderLen:]...)
	return out, nil
}

// documentSeed hashes what the preview's pixels derive from: the content, or
// the name and source URI when there is no inline content.
func documentSeed(doc Document) [sha256.Size]byte {
	if len(doc.Content) > 0 {
		return sha256.Sum256(append([]byte("content\x00"), doc.Content...))
	}
	return sha256.Sum256([]byte("name\x00" + doc.Name + "\x00uri\x00" + doc.SourceURI))
}

// appendText appends a PNG tEXt chunk. Keywords are fixed Latin-1 constants;
// values are written as given (job and renderer ids are ASCII).
func appendText(b []byte, keyword, text string) []byte {
	data := make([]byte, 0, len(keyword)+1+len(text))
	data = append(data, keyword...)
	data = append(data, 0)
	data = append(data, text...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	start := len(b)
	b = append(b, "tEXt"...)
	b = append(b, data...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b[start:]))
}

// TextChunks returns the tEXt chunks of a PNG as a map from keyword to text.
// It returns an error when b is not a well-formed chunk sequence.
func TextChunks(b []byte) (map[string]string, error) {
	const sig = "\x89PNG\r\n\x1a\n"
	if !bytes.HasPrefix(b, []byte(sig)) {
		return nil, fmt.Errorf("mock: not a PNG")
	}
	out := map[string]string{}
	for p := len(sig); p < len(b); {
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
