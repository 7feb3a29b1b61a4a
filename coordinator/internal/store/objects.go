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
// afterwards (see ObjectTomb and ObjectMissing).

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
	b := t.tx.Bucket(bucketObjectRefs)
	if b == nil {
		return nil // a file from before the artifact store
	}
	_ = b.ForEach(func(k, v []byte) error {
		team, digest := splitObjectKey(k)
		out = append(out, ObjectRef{Team: team, Digest: digest, Refs: btoi(v)})
		return nil
	})
	return out
}

// The object clock is the writer's logical clock of the sweep: a counter
// in the meta bucket that every doom and every burial moves on by one, in
// the transaction that writes the tombstone, so that it replicates with it
// and never goes back across leaders or restarts. A caller that reads it
// (ObjectClock) before it checks or puts an object in the store can later
// tell, on the writer, whether a doom or a burial came after its check
// (ObjectMissing), without comparing two wall clocks.
var (
	keyObjectClock = []byte("artifact_clock")
	// keyObjectForgotten is the largest burial reading among the
	// tombstones forgotten so far: a check read before it can no longer be
	// judged and is refused.
	keyObjectForgotten = []byte("artifact_forgotten")
)

// ObjectClock returns the object clock's reading.
func (t *Tx) ObjectClock() uint64 { return t.metaCounter(keyObjectClock) }

// metaCounter reads a counter of the meta bucket, 0 when unset.
func (t *Tx) metaCounter(key []byte) uint64 {
	v := t.tx.Bucket(bucketMeta).Get(key)
	if len(v) != 8 {
		return 0
	}
	return btoi(v)
}

// tickObjectClock moves the object clock on by one and returns the new
// reading.
func (t *Tx) tickObjectClock() (uint64, error) {
	n := t.ObjectClock() + 1
	return n, t.put(bucketMeta, keyObjectClock, itob(n))
}

// ObjectTomb marks an object the sweep is deleting. Doomed is the object
// clock's reading when the writer found the object unreferenced and marked
// it; Buried, 0 until the deletion is done, its reading when the sweep
// reported the object deleted, and BuriedAt the writer's wall clock then
// (ForgetTombs judges a tombstone's age by it).
type ObjectTomb struct {
	Doomed, Buried uint64
	BuriedAt       time.Time
}

// tombLen is the length of an encoded tombstone.
const tombLen = 24

func encodeTomb(tomb ObjectTomb) []byte {
	v := make([]byte, tombLen)
	binary.BigEndian.PutUint64(v, tomb.Doomed)
	binary.BigEndian.PutUint64(v[8:], tomb.Buried)
	if !tomb.BuriedAt.IsZero() {
		binary.BigEndian.PutUint64(v[16:], uint64(max(tomb.BuriedAt.UnixNano(), 0)))
	}
	return v
}

func decodeTomb(v []byte) (ObjectTomb, bool) {
	if len(v) != tombLen {
		return ObjectTomb{}, false
	}
	return ObjectTomb{Doomed: btoi(v[:8]), Buried: btoi(v[8:16]), BuriedAt: unixTime(v[16:])}, true
}

// Tomb returns the object's tombstone, if any.
func (t *Tx) Tomb(team, digest string) (ObjectTomb, bool) {
	return decodeTomb(t.tx.Bucket(bucketObjectTombs).Get(objectKey(team, digest)))
}

// DoomObject writes the object's tombstone, doomed now on the object
// clock, over any earlier one.
func (t *Tx) DoomObject(team, digest string) error {
	n, err := t.tickObjectClock()
	if err != nil {
		return err
	}
	return t.put(bucketObjectTombs, objectKey(team, digest), encodeTomb(ObjectTomb{Doomed: n}))
}

// BuryObject marks the object's tombstone buried, now on the object clock
// and at the writer's wall clock at; an object without a tombstone, or
// buried already, is left as it is.
func (t *Tx) BuryObject(team, digest string, at time.Time) error {
	tomb, ok := t.Tomb(team, digest)
	if !ok || tomb.Buried != 0 {
		return nil
	}
	n, err := t.tickObjectClock()
	if err != nil {
		return err
	}
	tomb.Buried, tomb.BuriedAt = n, at
	return t.put(bucketObjectTombs, objectKey(team, digest), encodeTomb(tomb))
}

// DeleteTomb removes the object's tombstone: a completion found the
// object again after its burial and set a pointer to it.
func (t *Tx) DeleteTomb(team, digest string) error {
	return t.del(bucketObjectTombs, objectKey(team, digest))
}

// ForgetTombs removes the tombstones buried before cutoff (on the writer's
// wall clock) and returns how many; the largest burial reading among them
// is kept, so that ObjectMissing refuses a check older than the tombstones
// it can no longer see.
func (t *Tx) ForgetTombs(cutoff time.Time) (int, error) {
	var n int
	last := t.metaCounter(keyObjectForgotten)
	for _, e := range t.Tombs() {
		if e.Buried == 0 || !e.BuriedAt.Before(cutoff) {
			continue
		}
		if err := t.DeleteTomb(e.Team, e.Digest); err != nil {
			return n, err
		}
		last = max(last, e.Buried)
		n++
	}
	if n == 0 {
		return 0, nil
	}
	return n, t.put(bucketMeta, keyObjectForgotten, itob(last))
}

// ObjectMissing reports whether a completion may not set a pointer to the
// object (team, digest), found in the store by a check that read the
// object clock at seen before it began: the sweep doomed the object and
// has not reported it deleted, or reported it deleted after seen (the
// check may have seen it before the deletion), or the tombstone that would
// say is forgotten (seen is older than a forgotten burial). An object
// whose tombstone was buried at or before seen was found again after its
// deletion: uploaded anew.
func (t *Tx) ObjectMissing(team, digest string, seen uint64) bool {
	if seen < t.metaCounter(keyObjectForgotten) {
		return true
	}
	tomb, ok := t.Tomb(team, digest)
	return ok && (tomb.Buried == 0 || tomb.Buried > seen)
}

// TombEntry is one tombstone of a listing.
type TombEntry struct {
	Team, Digest string
	ObjectTomb
}

// Tombs returns every tombstone, in key order.
func (t *Tx) Tombs() []TombEntry {
	var out []TombEntry
	b := t.tx.Bucket(bucketObjectTombs)
	if b == nil {
		return nil // a file from before the artifact store
	}
	_ = b.ForEach(func(k, v []byte) error {
		tomb, ok := decodeTomb(v)
		if !ok {
			return nil
		}
		team, digest := splitObjectKey(k)
		out = append(out, TombEntry{Team: team, Digest: digest, ObjectTomb: tomb})
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
