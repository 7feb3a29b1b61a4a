package store

import (
	"errors"
	"fmt"
)

// CheckIndexes checks that the indexes and counts of the store agree with
// its job and batch records, with the checks Verify runs on them, and
// returns every disagreement, joined, or nil. It reads the whole file:
// tests and diagnostics call it, the writer never does.
func (t *Tx) CheckIndexes() error {
	var sum Summary
	verifyRecords(t, &sum, true)
	errs := make([]error, 0, len(sum.Problems)+1)
	for _, p := range sum.Problems {
		errs = append(errs, errors.New(p))
	}
	if sum.Omitted > 0 {
		errs = append(errs, fmt.Errorf("and %d more problems", sum.Omitted))
	}
	return errors.Join(errs...)
}
