package store_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/leasehold/leasehold/coordinator/internal/store"
)

func TestArtifacts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	art := func(job, token uint64) store.Artifact {
		content := bytes.Repeat([]byte{byte(job), byte(token)}, 300)
		return store.Artifact{Digest: "digest-" + string(rune('a'+job)) + string(rune('a'+token)), ContentType: "image/png", Content: content, Renderer: "r-1"}
	}
	stored := [][2]uint64{{1, 1}, {1, 2}, {1, 3}, {2, 1}, {256, 1}}
	b.update(t, func(tx *store.Tx) error {
		for _, k := range stored {
			if err := tx.PutArtifact(k[0], k[1], art(k[0], k[1])); err != nil {
				return err
			}
		}
		return nil
	})
	// present lists which of the stored artifacts can be read.
	present := func(t *testing.T) [][2]uint64 {
		t.Helper()
		var out [][2]uint64
		b.view(t, func(tx *store.Tx) error {
			for _, k := range stored {
				a, err := tx.Artifact(k[0], k[1])
				if errors.Is(err, store.ErrArtifactNotFound) {
					continue
				}
				if err != nil {
					t.Fatalf("Artifact(%d, %d): %v", k[0], k[1], err)
				}
				if diff := cmp.Diff(art(k[0], k[1]), a); diff != "" {
					t.Errorf("Artifact(%d, %d) (-want +got):\n%s", k[0], k[1], diff)
				}
				out = append(out, k)
			}
			return nil
		})
		return out
	}

	t.Run("Put then get returns every field", func(t *testing.T) {
		if diff := cmp.Diff(stored, present(t)); diff != "" {
			t.Errorf("artifacts present (-want +got):\n%s", diff)
		}
		b.view(t, func(tx *store.Tx) error {
			want := art(1, 2)
			st, err := tx.Staged(1, 2)
			if err != nil || st.Digest != want.Digest || st.ContentType != want.ContentType || st.Size != int64(len(want.Content)) || st.Stored {
				t.Errorf("Staged(1, 2) = %+v, %v; want %q, %q, %d", st, err, want.Digest, want.ContentType, len(want.Content))
			}
			if _, err := tx.Artifact(1, 4); !errors.Is(err, store.ErrArtifactNotFound) {
				t.Errorf("Artifact(1, 4) err = %v, want ErrArtifactNotFound", err)
			}
			if _, err := tx.Staged(3, 1); !errors.Is(err, store.ErrArtifactNotFound) {
				t.Errorf("Staged(3, 1) err = %v, want ErrArtifactNotFound", err)
			}
			return nil
		})
	})

	t.Run("The content read is a copy that outlives the transaction", func(t *testing.T) {
		var got store.Artifact
		b.view(t, func(tx *store.Tx) (err error) {
			got, err = tx.Artifact(2, 1)
			return err
		})
		b.update(t, func(tx *store.Tx) error { return tx.PutArtifact(2, 9, art(9, 9)) })
		if diff := cmp.Diff(art(2, 1), got); diff != "" {
			t.Errorf("artifact after its transaction ended (-want +got):\n%s", diff)
		}
		b.update(t, func(tx *store.Tx) error { return tx.DeleteArtifacts(2, 1) })
	})

	t.Run("DeleteArtifacts keeps only the named lease's preview", func(t *testing.T) {
		b.update(t, func(tx *store.Tx) error { return tx.DeleteArtifacts(1, 2) })
		want := [][2]uint64{{1, 2}, {2, 1}, {256, 1}}
		if diff := cmp.Diff(want, present(t)); diff != "" {
			t.Errorf("artifacts after DeleteArtifacts(1, 2) (-want +got):\n%s", diff)
		}
	})

	t.Run("DeleteArtifacts with keep 0 drops all of the job's and no other's", func(t *testing.T) {
		b.update(t, func(tx *store.Tx) error { return tx.DeleteArtifacts(1, 0) })
		want := [][2]uint64{{2, 1}, {256, 1}}
		if diff := cmp.Diff(want, present(t)); diff != "" {
			t.Errorf("artifacts after DeleteArtifacts(1, 0) (-want +got):\n%s", diff)
		}
	})

	t.Run("DeleteArtifacts of a job without any writes nothing", func(t *testing.T) {
		b.update(t, func(tx *store.Tx) error {
			if err := tx.DeleteArtifacts(77, 0); err != nil {
				return err
			}
			if tx.Dirty() {
				t.Error("Dirty after deleting nothing, want clean")
			}
			return nil
		})
	})
}
