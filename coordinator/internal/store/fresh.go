package store

import (
	"bytes"
	"errors"

	"go.etcd.io/bbolt"
)

// errHeld ends the walk of HoldsRecords at the first record.
var errHeld = errors.New("holds a record")

// HoldsRecords reports whether the store holds anything but its schema
// version: a job, a batch, an audit record, the dispatch switch, a
// sequence, a replica's bookkeeping. A file Open has just created holds
// nothing.
func (s *Store) HoldsRecords() (bool, error) {
	err := s.view(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			c := b.Cursor()
			for k, _ := c.First(); k != nil; k, _ = c.Next() {
				if bytes.Equal(name, bucketMeta) && bytes.Equal(k, keySchema) {
					continue
				}
				return errHeld
			}
			return nil
		})
	})
	if errors.Is(err, errHeld) {
		return true, nil
	}
	return false, err
}
