package store

// WithoutSync opens the file with bbolt's NoSync: a commit writes its pages
// but does not fsync them, so it survives the process (the pages are in the
// kernel's cache) and not a power loss. The simulator uses it: it restarts
// the coordinator by closing and reopening the file in one process, which
// fsync has no part in, and power loss is beyond what it simulates. The
// coordinator never uses it: its acknowledgements promise durability.
func WithoutSync() Option { return func(s *Store) { s.noSync = true } }
