package tcpproxy

// http2Preface is what an HTTP/2 client sends before its first frame
// (RFC 9113, section 3.4).
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// Frame layout (RFC 9113, section 4.1): a 9-byte header of a 24-bit payload
// length, an 8-bit type, 8 bits of flags and a 31-bit stream id.
const (
	frameHeaderLen = 9
	frameTypeData  = 0x0
)

// frameReader follows the HTTP/2 frames of one direction of a connection
// as its bytes go by, without keeping them.
type frameReader struct {
	// skip counts the bytes of the client's preface still to pass.
	skip int
	// hdr collects the current frame's header; n counts its bytes so far.
	hdr [frameHeaderLen]byte
	n   int
	// left counts the current frame's payload bytes still to come.
	left int
}

// feed follows b and returns how many non-empty DATA frames ended in it.
func (f *frameReader) feed(b []byte) (ended int) {
	for len(b) > 0 {
		switch {
		case f.skip > 0:
			k := min(f.skip, len(b))
			f.skip -= k
			b = b[k:]
		case f.n < frameHeaderLen:
			k := copy(f.hdr[f.n:], b)
			f.n += k
			b = b[k:]
			if f.n == frameHeaderLen {
				f.left = int(f.hdr[0])<<16 | int(f.hdr[1])<<8 | int(f.hdr[2])
				if f.left == 0 {
					f.n = 0 // an empty frame of any type: nothing to count
				}
			}
		default:
			k := min(f.left, len(b))
			f.left -= k
			b = b[k:]
			if f.left == 0 {
				if f.hdr[3] == frameTypeData {
					ended++
				}
				f.n = 0
			}
		}
	}
	return ended
}
