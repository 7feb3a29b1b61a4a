package store_test

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/leasehold/leasehold/coordinator/internal/store"
	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
)

// writeSetOf encodes a write set of ops on base by hand, as no writer
// would make it.
func writeSetOf(t *testing.T, base uint64, ops ...*storagev1.WriteOp) []byte {
	t.Helper()
	b, err := proto.Marshal(&storagev1.WriteSet{Version: store.WriteSetVersion, Base: base, Ops: ops})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMalformedWriteSets: each malformed write set is refused whole, with
// nothing written (checked before the first write), on any base; in a run
// of entries, those before it are applied and committed, it and those
// after it are not, and the error names its index.
func TestMalformedWriteSets(t *testing.T) {
	t.Parallel()
	const jobsBucket, tokensBucket = 2, 16
	put := func(key, value []byte) *storagev1.WriteOp {
		return &storagev1.WriteOp{Kind: storagev1.WriteOp_KIND_PUT, Bucket: jobsBucket, Key: key, Value: value}
	}
	seq := func(n uint64) *storagev1.WriteOp {
		return &storagev1.WriteOp{Kind: storagev1.WriteOp_KIND_SET_SEQUENCE, Bucket: tokensBucket, Sequence: n}
	}
	for _, tc := range []struct {
		name string
		ops  []*storagev1.WriteOp
		// onBase: malformed only when evaluated on the store's state; of
		// another base it is applied as nothing, as a deposed leader's.
		onBase bool
	}{
		{"An unknown bucket", []*storagev1.WriteOp{put([]byte("a"), nil), {Kind: storagev1.WriteOp_KIND_PUT, Bucket: 999, Key: []byte("k")}}, false},
		{"An unknown kind", []*storagev1.WriteOp{put([]byte("a"), nil), {Kind: 42, Bucket: jobsBucket, Key: []byte("k")}}, false},
		{"An empty key", []*storagev1.WriteOp{put([]byte("a"), nil), put(nil, []byte("v"))}, false},
		{"A key longer than bbolt takes", []*storagev1.WriteOp{put([]byte("a"), nil), put(bytes.Repeat([]byte("k"), 40000), nil)}, false},
		{"A sequence moved back within the set", []*storagev1.WriteOp{put([]byte("a"), nil), seq(9), seq(3)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			primary := setup(t)
			good := recorded(t, primary.st, 0, populateTx)
			before := digest(t, b.st)
			ws := writeSetOf(t, 0, tc.ops...)
			if err := b.st.CheckWriteSet(1, ws); !errors.Is(err, store.ErrWriteSet) {
				t.Errorf("CheckWriteSet = %v, want ErrWriteSet", err)
			}
			if err := b.st.ApplyWriteSet(1, ws); !errors.Is(err, store.ErrWriteSet) {
				t.Errorf("ApplyWriteSet = %v, want ErrWriteSet", err)
			}
			if digest(t, b.st) != before {
				t.Fatal("a malformed write set changed the store")
			}
			if rs, _ := b.st.ReplicaState(); rs.Applied != 0 {
				t.Fatalf("a malformed write set was counted applied: %+v", rs)
			}
			other := writeSetOf(t, 7, tc.ops...)
			want := store.ErrWriteSet
			if tc.onBase {
				want = store.ErrStaleBase
			}
			if err := b.st.CheckWriteSet(1, other); !errors.Is(err, want) && !(tc.onBase && err == nil) {
				t.Errorf("CheckWriteSet of another base = %v, want %v", err, want)
			}
			if err := b.st.ApplyWriteSet(1, other); !errors.Is(err, want) {
				t.Errorf("ApplyWriteSet of another base = %v, want %v", err, want)
			}
			if digest(t, b.st) != before {
				t.Fatal("a write set of another base changed the store")
			}
			bad := writeSetOf(t, 1, tc.ops...)
			res, err := b.st.ApplyWriteSets([]store.Entry{{Index: 1, WriteSet: good}, {Index: 2, WriteSet: bad}, {Index: 3, WriteSet: good}})
			if tc.onBase {
				// Entry 1 of another base was consumed above; replay on a
				// fresh store.
				b = setup(t)
				res, err = b.st.ApplyWriteSets([]store.Entry{{Index: 1, WriteSet: good}, {Index: 2, WriteSet: bad}, {Index: 3, WriteSet: good}})
			}
			var eerr *store.EntryError
			if !errors.As(err, &eerr) || eerr.Index != 2 || !errors.Is(err, store.ErrWriteSet) {
				t.Fatalf("ApplyWriteSets = %v, want an EntryError naming entry 2", err)
			}
			if len(res) != 3 || res[0] != nil {
				t.Errorf("outcomes %v, want entry 1 applied", res)
			}
			if rs, _ := b.st.ReplicaState(); rs.Applied != 1 || rs.Group != 1 {
				t.Errorf("ReplicaState = %+v, want entry 1 applied and nothing after it", rs)
			}
			if digest(t, b.st) != digest(t, primary.st) {
				t.Error("the entry before the malformed one did not commit as written")
			}
		})
	}
}

// TestHaltAndSkip: a replica records the entry it stopped at; an operator
// may allow the skip of that entry or of one not reached yet, never of an
// applied one or another than the one it stopped at; a skip allowed
// applies the entry as nothing, once.
func TestHaltAndSkip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	primary := setup(t)
	if err := b.st.ApplyWriteSet(1, recorded(t, primary.st, 0, populateTx)); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.st.Halted(); ok || err != nil {
		t.Fatalf("Halted on a fresh replica = %v, %v", ok, err)
	}
	if err := b.st.Halt(store.HaltedEntry{Index: 4, Term: 2, Data: []byte{0x7f, 1}}); err != nil {
		t.Fatal(err)
	}
	h, ok, err := b.st.Halted()
	if err != nil || !ok || h.Index != 4 || h.Term != 2 || !bytes.Equal(h.Data, []byte{0x7f, 1}) {
		t.Fatalf("Halted = %+v, %v, %v; want entry 4 of term 2 with its bytes", h, ok, err)
	}
	if err := b.st.AllowSkip(5); !errors.Is(err, store.ErrNotHalted) {
		t.Errorf("AllowSkip(5) after stopping at 4 = %v, want ErrNotHalted", err)
	}
	if err := b.st.AllowSkip(1); err == nil {
		t.Error("AllowSkip of an applied entry succeeded")
	}
	if skipped, err := b.st.SkipEntry(4); skipped || err != nil {
		t.Errorf("SkipEntry(4) before AllowSkip = %v, %v; want not skipped", skipped, err)
	}
	if err := b.st.AllowSkip(4); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := b.st.Halted(); ok {
		t.Error("the halt outlived the skip allowed for its entry")
	}
	if err := b.st.AllowSkip(9); err != nil {
		t.Errorf("AllowSkip of an entry not reached yet: %v", err)
	}
	if got, _ := b.st.SkipsAllowed(); len(got) != 2 || got[0] != 4 || got[1] != 9 {
		t.Errorf("SkipsAllowed = %v, want [4 9]", got)
	}
	before := digest(t, b.st)
	if skipped, err := b.st.SkipEntry(4); !skipped || err != nil {
		t.Fatalf("SkipEntry(4) = %v, %v; want skipped", skipped, err)
	}
	if rs, _ := b.st.ReplicaState(); rs.Applied != 4 || rs.Group != 1 {
		t.Errorf("ReplicaState = %+v, want entry 4 applied as nothing (group still 1)", rs)
	}
	if digest(t, b.st) != before {
		t.Error("a skipped entry changed the records")
	}
	if skipped, _ := b.st.SkipEntry(4); skipped {
		t.Error("an entry was skipped twice")
	}
	if skipped, _ := b.st.SkipEntry(6); skipped {
		t.Error("an entry no skip allowed was skipped")
	}
}
