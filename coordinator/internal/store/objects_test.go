package store_test

import (
	"testing"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// TestObjectMissing walks one object through its sweep, doomed, buried and
// forgotten, and judges checks read on the object clock before and after
// each step.
func TestObjectMissing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const team, digest = "alpha", "d1"
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := func() (n uint64) {
		b.view(t, func(tx *store.Tx) error { n = tx.ObjectClock(); return nil })
		return n
	}
	missing := func(seen uint64) (m bool) {
		b.view(t, func(tx *store.Tx) error { m = tx.ObjectMissing(team, digest, seen); return nil })
		return m
	}

	beforeDoom := clock()
	if missing(beforeDoom) {
		t.Fatal("an object the sweep never touched is missing")
	}
	b.update(t, func(tx *store.Tx) error { return tx.DoomObject(team, digest) })
	afterDoom := clock()
	if !missing(beforeDoom) || !missing(afterDoom) {
		t.Error("a doomed object may be named: the sweep is deleting it")
	}
	b.update(t, func(tx *store.Tx) error { return tx.BuryObject(team, digest, t0) })
	afterBurial := clock()
	if !(afterDoom > beforeDoom && afterBurial > afterDoom) {
		t.Fatalf("object clock %d, %d, %d: want it to move on at each step", beforeDoom, afterDoom, afterBurial)
	}
	if !missing(afterDoom) {
		t.Error("a check from before the burial may name the object: it may have seen it before its deletion")
	}
	if missing(afterBurial) {
		t.Error("a check from after the burial may not name the object: it found it uploaded anew")
	}
	b.update(t, func(tx *store.Tx) error {
		n, err := tx.ForgetTombs(t0)
		if n != 0 {
			t.Errorf("ForgetTombs at the burial forgot %d tombstones, want none", n)
		}
		return err
	})
	b.update(t, func(tx *store.Tx) error {
		n, err := tx.ForgetTombs(t0.Add(time.Second))
		if n != 1 {
			t.Errorf("ForgetTombs after the burial forgot %d tombstones, want 1", n)
		}
		return err
	})
	if !missing(afterDoom) {
		t.Error("a check from before a forgotten burial may name the object")
	}
	if missing(afterBurial) {
		t.Error("a check from after a forgotten burial may not name the object")
	}
}
