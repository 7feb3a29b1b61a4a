package store_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"github.com/leasehold/leasehold/coordinator/internal/jobs"
	"github.com/leasehold/leasehold/coordinator/internal/store"
	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
)

var updateCorpus = flag.Bool("update-fuzz-corpus", false, "rewrite the seed corpus of FuzzDecodeJob from real records")

const corpusDir = "testdata/fuzz/FuzzDecodeJob"

// FuzzDecodeJob feeds arbitrary bytes to the job decoder that every read
// of a job goes through: it must refuse or decode, never panic, and what
// it decodes must encode and decode again to the same job. The seeds in
// testdata/fuzz/FuzzDecodeJob are real records (TestFuzzCorpus).
func FuzzDecodeJob(f *testing.F) {
	f.Fuzz(func(t *testing.T, v []byte) {
		j, err := store.DecodeJob(v)
		if err != nil {
			return
		}
		again, err := store.EncodeJob(j)
		if err != nil {
			t.Fatalf("a decoded job does not encode: %v", err)
		}
		back, err := store.DecodeJob(again)
		if err != nil {
			t.Fatalf("a re-encoded job does not decode: %v", err)
		}
		if diff := cmp.Diff(j, back); diff != "" {
			t.Errorf("job after a second round trip (-first +second):\n%s", diff)
		}
	})
}

// FuzzFieldScanners feeds arbitrary bytes to the readers that take single
// fields out of encoded records without decoding them (start-up's queued
// scan, the reconciliation of job states, an uploaded preview's digest):
// they must never panic, and wherever the generated decoder accepts the
// bytes they must accept them too and read the same values.
func FuzzFieldScanners(f *testing.F) {
	queued := fullJob(3, 1, "alpha")
	queued.Phase = jobs.PhaseQueued
	for _, j := range []jobs.Job{fullJob(3, 1, "alpha"), queued} {
		v, err := store.EncodeJob(j)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(v)
	}
	art, err := proto.Marshal(&storagev1.ArtifactRecord{Digest: "sha256:ab", ContentType: "image/png", Content: []byte{1, 2, 3}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(art)
	f.Fuzz(func(t *testing.T, v []byte) {
		q, isQueued, qerr := store.ScanQueued(v)
		st, serr := store.ScanState(v)
		var r storagev1.JobRecord
		if proto.Unmarshal(v, &r) == nil {
			if qerr != nil || serr != nil {
				t.Fatalf("the scanners refuse a record the decoder reads: %v, %v", qerr, serr)
			}
			if st.Phase != jobs.Phase(r.Phase) || st.EventSeq != r.EventSeq {
				t.Errorf("ScanState = phase %d, seq %d; decoder: phase %d, seq %d", st.Phase, st.EventSeq, r.Phase, r.EventSeq)
			}
			want := jobs.Phase(r.Phase) == jobs.PhaseQueued
			if isQueued != want || (want && (q.Team != r.Team || q.EnqueuedAt != r.EnqueuedAt)) {
				t.Errorf("ScanQueued = %+v queued %v; decoder: team %q, enqueued %d, phase %d", q, isQueued, r.Team, r.EnqueuedAt, r.Phase)
			}
		}
		staged, aerr := store.ScanArtifact(v)
		var a storagev1.ArtifactRecord
		if proto.Unmarshal(v, &a) == nil {
			if aerr != nil {
				t.Fatalf("ScanArtifact refuses a record the decoder reads: %v", aerr)
			}
			size := int64(len(a.Content))
			if a.Stored {
				size = a.Size
			}
			if staged.Digest != a.Digest || staged.ContentType != a.ContentType || staged.Size != size || staged.Stored != a.Stored {
				t.Errorf("ScanArtifact = %+v; decoder: %q %q %d %v", staged, a.Digest, a.ContentType, size, a.Stored)
			}
		}
	})
}

// realRecords returns job records as the store writes them: every field
// set, a zero record, and the schema 1 fixture's records before and after
// migration (schema 1 ones carry their history).
func realRecords(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	full := fullJob(3, 1, "alpha")
	full.Leases = append(full.Leases, jobs.LeaseRecord{Token: 42, Renderer: "r-2"})
	for name, j := range map[string]jobs.Job{"schema2-full": full, "schema2-zero": {ID: 7}} {
		v, err := store.EncodeJob(j)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = v
	}
	fx := copyFixture(t)
	for k, v := range rawDump(t, fx.db)["jobs"].Items {
		out[fmt.Sprintf("schema1-job-%d", k[7])] = []byte(v)
	}
	openFixture(t, fx.db, store.WithLegacyArtifacts(fx.arts)).Close()
	for k, v := range rawDump(t, fx.db)["jobs"].Items {
		out[fmt.Sprintf("schema2-migrated-job-%d", k[7])] = []byte(v)
	}
	return out
}

// TestFuzzCorpus checks that the committed seeds are there and decode;
// go test -run TestFuzzCorpus -update-fuzz-corpus rewrites them from the
// records the store writes today.
func TestFuzzCorpus(t *testing.T) {
	t.Parallel()
	records := realRecords(t)
	if *updateCorpus {
		if err := os.MkdirAll(corpusDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, v := range records {
			entry := "go test fuzz v1\n[]byte(" + strconv.Quote(string(v)) + ")\n"
			if err := os.WriteFile(filepath.Join(corpusDir, name), []byte(entry), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	entries, err := os.ReadDir(corpusDir)
	if err != nil {
		t.Fatalf("reading the seed corpus: %v", err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		raw, err := os.ReadFile(filepath.Join(corpusDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lit, ok := strings.CutPrefix(string(raw), "go test fuzz v1\n[]byte(")
		lit, ok2 := strings.CutSuffix(lit, ")\n")
		v, err := strconv.Unquote(lit)
		if !ok || !ok2 || err != nil {
			t.Errorf("seed %s is not a []byte corpus entry: %v", e.Name(), err)
			continue
		}
		if _, err := store.DecodeJob([]byte(v)); err != nil {
			t.Errorf("seed %s does not decode: %v", e.Name(), err)
		}
	}
	var want []string
	for name := range records {
		want = append(want, name)
	}
	slices.Sort(want)
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("seed corpus files (-want +got); rerun with -update-fuzz-corpus:\n%s", diff)
	}
}

// FuzzParseWriteSet: the replica's decoder of write sets, which takes no
// message per write, reads every input as proto.Unmarshal does: the same
// write set, or an error for both.
func FuzzParseWriteSet(f *testing.F) {
	f.Add([]byte{})
	ws := &storagev1.WriteSet{Version: 1, Base: 7, WallUnixNano: -5, Ops: []*storagev1.WriteOp{
		{Kind: storagev1.WriteOp_KIND_PUT, Bucket: 2, Key: []byte("k"), Value: []byte("v")},
		{Kind: storagev1.WriteOp_KIND_DELETE, Bucket: 3, Key: []byte("gone")},
		{Kind: storagev1.WriteOp_KIND_SET_SEQUENCE, Bucket: 16, Sequence: 1 << 40},
	}}
	good, err := proto.Marshal(ws)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(append(slices.Clone(good), 0x28, 0x01)) // an unknown field
	f.Add(good[:len(good)-3])
	f.Fuzz(func(t *testing.T, b []byte) {
		var want storagev1.WriteSet
		werr := proto.Unmarshal(b, &want)
		got, err := store.ParseWriteSet(b)
		if (err == nil) != (werr == nil) {
			t.Fatalf("%x: the replica's decoder says %v, proto.Unmarshal %v", b, err, werr)
		}
		// The replica has no use for unknown fields: it skips them.
		want.ProtoReflect().SetUnknown(nil)
		for _, op := range want.GetOps() {
			op.ProtoReflect().SetUnknown(nil)
		}
		if err == nil && !proto.Equal(got, &want) {
			t.Fatalf("%x: the replica's decoder read %v, proto.Unmarshal %v", b, got, &want)
		}
	})
}
