// Package overview is the live picture of the coordinator that consoles and
// `leasehold top` show, and the feed it is published through. The writer
// (package engine) builds each picture from its own state on its goroutine
// and publishes it; readers, on theirs, take the latest without waiting.
package overview
