package store

import (
	"bytes"
	"encoding/binary"
	"time"
)

// Objects in the artifact store: a succeeded job whose preview is in the
// store (jobs.Artifact.Stored) holds a pointer, and the store's records
// count the pointers that name each (team, digest) in "artifact_refs", in
// the transaction that sets or drops a pointer, so the counts replicate
// with the write set that moved them. An object no pointer names may be
// deleted from the store; the sweep that deletes it first writes a
// tombstone in "artifact_tombs" through the writer, so that a completion
// that checked the object before it was deleted cannot set a pointer to it
// afterwards (see ObjectTomb).

// objectKey is the key of (team, digest) in the object buckets.
func objectKey(team, digest string) []byte {
	k := make([]byte, 0, len(team)+1+len(digest))
	k = append(k, team...)
	k = append(k, 0)
	return append(k, digest...)
}

// splitObjectKey is objectKey's inverse.
func splitObjectKey(k []byte) (team, digest string) {
	i := bytes.IndexByte(k, 0)
	if i < 0 {
		return "", string(k)
	}
	return string(k[:i]), string(k[i+1:])
}

// ObjectRefs returns how many pointers name the object (team, digest).
func (t *Tx) ObjectRefs(team, digest string) uint64 {
	v := t.tx.Bucket(bucketObjectRefs).Get(objectKey(team, digest))
	if len(v) != 8 {
		return 0
	}
	return btoi(v)
}

// RefObject counts one more pointer to (team, digest).
func (t *Tx) RefObject(team, digest string) error {
	return t.put(bucketObjectRefs, objectKey(team, digest), itob(t.ObjectRefs(team, digest)+1))
}

// UnrefObject counts one pointer to (team, digest) fewer, dropping the
// count at zero: the object is then an orphan the sweep may delete.
func (t *Tx) UnrefObject(team, digest string) error {
	n := t.ObjectRefs(team, digest)
	if n <= 1 {
		return t.del(bucketObjectRefs, objectKey(team, digest))
	}
	return t.put(bucketObjectRefs, objectKey(team, digest), itob(n-1))
}

// ObjectRef is one counted object, for listings (backup, check).
type ObjectRef struct {
	Team, Digest string
	Refs         uint64
}

// ObjectRefsList returns every object a pointer names, in key order.
func (t *Tx) ObjectRefsList() []ObjectRef {
	var out []ObjectRef
	_ = t.tx.Bucket(bucketObjectRefs).ForEach(func(k, v []byte) error {
		team, digest := splitObjectKey(k)
		out = append(out, ObjectRef{Team: team, Digest: digest, Refs: btoi(v)})
		return nil
	})
	return out
}

// ObjectTomb marks an object the sweep is deleting. Doomed is when the
// writer found it unreferenced and marked it; Buried, zero until the
// deletion is done, is when the sweep had deleted it. A completion that
// checked the object in the store at time c may set a pointer to it only
// when there is no tombstone, or the tombstone is buried and c is after
// Buried (the object it saw was uploaded again after the deletion).
type ObjectTomb struct {
	Doomed, Buried time.Time
}

// Tomb returns the object's tombstone, if any.
func (t *Tx) Tomb(team, digest string) (ObjectTomb, bool) {
	v := t.tx.Bucket(bucketObjectTombs).Get(objectKey(team, digest))
	if len(v) != 16 {
		return ObjectTomb{}, false
	}
	return ObjectTomb{Doomed: unixTime(v[:8]), Buried: unixTime(v[8:])}, true
}

// PutTomb writes the object's tombstone.
func (t *Tx) PutTomb(team, digest string, tomb ObjectTomb) error {
	v := make([]byte, 16)
	binary.BigEndian.PutUint64(v, uint64(max(tomb.Doomed.UnixNano(), 0)))
	if !tomb.Buried.IsZero() {
		binary.BigEndian.PutUint64(v[8:], uint64(max(tomb.Buried.UnixNano(), 0)))
	}
	return t.put(bucketObjectTombs, objectKey(team, digest), v)
}

// DeleteTomb removes the object's tombstone.
func (t *Tx) DeleteTomb(team, digest string) error {
	return t.del(bucketObjectTombs, objectKey(team, digest))
}

// TombEntry is one tombstone of a listing.
type TombEntry struct {
	Team, Digest string
	ObjectTomb
}

// Tombs returns every tombstone, in key order.
func (t *Tx) Tombs() []TombEntry {
	var out []TombEntry
	_ = t.tx.Bucket(bucketObjectTombs).ForEach(func(k, v []byte) error {
		if len(v) != 16 {
			return nil
		}
		team, digest := splitObjectKey(k)
		out = append(out, TombEntry{Team: team, Digest: digest, ObjectTomb: ObjectTomb{Doomed: unixTime(v[:8]), Buried: unixTime(v[8:])}})
		return nil
	})
	return out
}

// unixTime reads a big-endian Unix time in nanoseconds; 0 is the zero time.
func unixTime(b []byte) time.Time {
	n := btoi(b)
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(n))
}

// requiredBucket reports whether a schema 2 file must have bucket b (it is
// not one of laterBuckets, which Open adds).
func requiredBucket(b []byte) bool {
	for _, l := range laterBuckets {
		if bytes.Equal(l, b) {
			return false
		}
	}
	return true
}
