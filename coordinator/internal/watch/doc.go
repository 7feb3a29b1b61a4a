// Package watch fans the writer's committed job events out to batch
// watchers. The writer publishes each event once its group is durable, on
// its own goroutine; handlers open, read and close watches from theirs.
// A watch buffers what is pending and ends, as too slow, once it falls
// WatchLimit events behind.
package watch
