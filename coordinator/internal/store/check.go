package store

// CheckIndexes checks that the indexes and counts of the store agree with
// its job and batch records, with the checks Verify runs on them, and
// returns every disagreement, joined, or nil. It reads the whole file:
// tests and diagnostics call it, the writer never does.
func (t *Tx) CheckIndexes() error {
	var sum Summary
	verifyRecords(t, &sum, true)
	return sum.Err()
}
