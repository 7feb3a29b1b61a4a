package fdlimit

// Limit is the process's limit on open file descriptors.
type Limit struct {
	// Soft is the limit in force; Hard is the most Soft may be raised to
	// without privileges.
	Soft, Hard uint64
}
