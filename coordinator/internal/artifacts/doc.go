// Package artifacts is the coordinator's artifact store: where previews too
// large to keep inline in a job's record live, beside the consensus path.
//
// Objects are content-addressed under their tenant: the key of a preview is
// <team>/sha256/<lower-case hex SHA-256 of its bytes>, so an upload can only
// add an object under its own digest and never change the bytes that an
// existing pointer names. The coordinator's records keep the pointer (the
// digest and size, set by a fenced completion through the writer); this
// package keeps the bytes.
//
// One interface, Store, has two implementations, chosen by Open from the
// --artifact-store URL:
//
//   - the embedded default, a directory beside the data file: every object is
//     written to a temporary name, fsynced, renamed into place, and its
//     directory fsynced, before Put returns, so that no completion can name
//     bytes a crash could lose. It serves one node: the directory is not
//     shared, so a cluster with it keeps previews inline (bounded);
//   - s3://bucket?endpoint=…&region=… for any S3-compatible store, through
//     aws-sdk-go-v2, with presigned PUT URLs bound to one key, its length
//     and its SHA-256 checksum, so that renderers upload straight to the
//     store and the bytes cross neither the coordinator nor raft.
//
// Every method does I/O: none may be called on the writer goroutine.
// Callers bound each call with a context.
package artifacts
