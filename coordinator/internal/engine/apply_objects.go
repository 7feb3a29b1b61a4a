package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// ObjectKey names an object of the artifact store by team and digest.
type ObjectKey struct{ Team, Digest string }

// DoomObjects marks for deletion those of keys that no pointer names and no
// live lease's staged upload names, and returns them: the sweep may delete
// those, and no completion that checked one of them before BuryObjects
// says its deletion is done sets a pointer to it (store.Tx.ObjectMissing).
func (e *Engine) DoomObjects(ctx context.Context, keys []ObjectKey) ([]ObjectKey, error) {
	return call(ctx, e, &doomCmd{keys: keys})
}

type doomCmd struct {
	base
	keys   []ObjectKey
	doomed []ObjectKey
}

func (c *doomCmd) result() []ObjectKey { return c.doomed }

func (c *doomCmd) text() error { return objectKeysText(c.keys) }

func (c *doomCmd) evaluate(g *group) error {
	tx, err := g.txn()
	if err != nil {
		return err
	}
	staged, err := g.e.stagedObjects(tx)
	if err != nil {
		return err
	}
	c.doomed = c.doomed[:0]
	for _, k := range c.keys {
		if tx.ObjectRefs(k.Team, k.Digest) > 0 || staged[k] {
			continue
		}
		if err := tx.DoomObject(k.Team, k.Digest); err != nil {
			return err
		}
		c.doomed = append(c.doomed, k)
	}
	return nil
}

// stagedObjects returns the objects that the uploads staged under the live
// leases name: their completions are still to come, however long the
// render took, so the sweep leaves them whatever their age. It reads one
// record per live lease, without its content.
func (e *Engine) stagedObjects(tx *store.Tx) (map[ObjectKey]bool, error) {
	out := make(map[ObjectKey]bool)
	for id, le := range e.leases {
		st, err := tx.Staged(id, le.token)
		switch {
		case errors.Is(err, store.ErrArtifactNotFound):
			continue
		case err != nil:
			return nil, err
		case st.Stored:
			out[ObjectKey{Team: le.team, Digest: st.Digest}] = true
		}
	}
	return out, nil
}

// BuryObjects records that the sweep deleted keys (each doomed before): a
// completion that checked one of them after this commits found it uploaded
// anew and may set a pointer to it.
func (e *Engine) BuryObjects(ctx context.Context, keys []ObjectKey) error {
	return e.do(ctx, &buryCmd{keys: keys})
}

type buryCmd struct {
	base
	keys []ObjectKey
}

func (c *buryCmd) text() error { return objectKeysText(c.keys) }

func (c *buryCmd) evaluate(g *group) error {
	tx, err := g.txn()
	if err != nil {
		return err
	}
	for _, k := range c.keys {
		if err := tx.BuryObject(k.Team, k.Digest, g.now); err != nil {
			return err
		}
	}
	return nil
}

// ForgetTombs drops the tombstones of objects buried longer than age ago
// on the writer's clock, and returns how many: a completion checked that
// long ago is refused (store.Tx.ObjectMissing), so they are no longer
// needed.
func (e *Engine) ForgetTombs(ctx context.Context, age time.Duration) (int, error) {
	return call(ctx, e, &forgetTombsCmd{age: age})
}

type forgetTombsCmd struct {
	base
	age time.Duration
	n   int
}

func (c *forgetTombsCmd) result() int { return c.n }

func (c *forgetTombsCmd) text() error { return nil }

func (c *forgetTombsCmd) evaluate(g *group) error {
	tx, err := g.txn()
	if err != nil {
		return err
	}
	c.n, err = tx.ForgetTombs(g.now.Add(-c.age))
	return err
}

// objectKeysText refuses keys the store's records may not hold.
func objectKeysText(keys []ObjectKey) error {
	for i, k := range keys {
		if !storable(k.Team) || !storable(k.Digest) {
			return badText(fmt.Sprintf("keys[%d]", i))
		}
	}
	return nil
}
