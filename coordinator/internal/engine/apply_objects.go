package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/coordinator/internal/store"
)

// ObjectKey names an object of the artifact store by team and digest.
type ObjectKey struct{ Team, Digest string }

// DoomObjects marks for deletion those of keys that no pointer names, and
// returns them: the sweep may delete those, and no completion sets a
// pointer to one of them until BuryObjects says the deletion is done (and
// then only to an object found after it). Keys a pointer names are left.
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
	c.doomed = c.doomed[:0]
	for _, k := range c.keys {
		if tx.ObjectRefs(k.Team, k.Digest) > 0 {
			continue
		}
		if err := tx.PutTomb(k.Team, k.Digest, store.ObjectTomb{Doomed: g.now}); err != nil {
			return err
		}
		c.doomed = append(c.doomed, k)
	}
	return nil
}

// BuryObjects records that the sweep deleted keys, all gone by at; a
// completion that finds one of them in the store after at (uploaded
// again) may set a pointer to it.
func (e *Engine) BuryObjects(ctx context.Context, keys []ObjectKey, at time.Time) error {
	return e.do(ctx, &buryCmd{keys: keys, at: at})
}

type buryCmd struct {
	base
	keys []ObjectKey
	at   time.Time
}

func (c *buryCmd) text() error { return objectKeysText(c.keys) }

func (c *buryCmd) evaluate(g *group) error {
	tx, err := g.txn()
	if err != nil {
		return err
	}
	for _, k := range c.keys {
		tomb, ok := tx.Tomb(k.Team, k.Digest)
		if !ok || !tomb.Buried.IsZero() {
			continue
		}
		tomb.Buried = c.at
		if err := tx.PutTomb(k.Team, k.Digest, tomb); err != nil {
			return err
		}
	}
	return nil
}

// ForgetTombs drops the tombstones of objects buried before before: no
// completion checked that long ago is still on its way to the writer.
func (e *Engine) ForgetTombs(ctx context.Context, before time.Time) (int, error) {
	return call(ctx, e, &forgetTombsCmd{before: before})
}

type forgetTombsCmd struct {
	base
	before time.Time
	n      int
}

func (c *forgetTombsCmd) result() int { return c.n }

func (c *forgetTombsCmd) text() error { return nil }

func (c *forgetTombsCmd) evaluate(g *group) error {
	tx, err := g.txn()
	if err != nil {
		return err
	}
	c.n = 0
	for _, t := range tx.Tombs() {
		if t.Buried.IsZero() || !t.Buried.Before(c.before) {
			continue
		}
		if err := tx.DeleteTomb(t.Team, t.Digest); err != nil {
			return err
		}
		c.n++
	}
	return nil
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
