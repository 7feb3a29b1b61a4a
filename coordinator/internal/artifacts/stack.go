package artifacts

// sdkStack is about the goroutine stack one call of the AWS SDK needs:
// every call passes through some sixty middleware frames.
const sdkStack = 32 << 10

// stackIndex and stackSink keep growStack's frame from being optimised
// away: growStack copies a byte of its frame to stackSink only when
// stackIndex is set, which it never is, and which the compiler cannot
// know. So no goroutine ever writes stackSink.
var (
	stackIndex = -1
	stackSink  byte
)

// growStack grows the calling goroutine's stack to about 2×sdkStack
// before an SDK call, while the stack is still shallow. A goroutine starts
// with a small stack that the runtime doubles, copying every frame on it,
// each time a call does not fit; a call into the SDK on a fresh goroutine
// (the server checks each stored preview on one) doubled it three or four
// times deep in the middleware, where each copy walks dozens of frames,
// and that copying took about a seventh of a leader's CPU in a cluster
// draining stored previews. One growth here copies the few frames of the
// caller; on a goroutine whose stack has already grown it costs the
// zeroing of the frame.
//
//go:noinline
func growStack() {
	var frame [sdkStack]byte
	if stackIndex >= 0 {
		stackSink = frame[stackIndex]
	}
}
