package deploy

import (
	"bufio"
	"cmp"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testbin"
)

// artifactStoreSecret is the Secret the coordinators read their artifact
// store from: its URL and their keys.
const artifactStoreSecret = "leasehold-artifact-store"

// artifactStore is the S3-compatible store of TestManifestsRun: versitygw,
// run by the test on the node's address (as a bucket outside the cluster
// would be), with the keys of the example Secret and the bucket its URL
// names, so that the coordinators' own credentials reach it.
type artifactStore struct {
	// root holds a directory per bucket; bucket is the example's.
	root, bucket string
	// env points a coordinator at the store in place of the example's
	// bucket: LEASEHOLD_ARTIFACT_STORE with the store's endpoint.
	env string
}

// startArtifactStore starts versitygw on nodeIP with the example Secret's
// keys and bucket, stopped when the test ends.
func startArtifactStore(t *testing.T, d *deployment) *artifactStore {
	t.Helper()
	s := d.secrets[artifactStoreSecret]
	if s == nil {
		t.Fatalf("%s has no Secret %s", exampleSecrets, artifactStoreSecret)
	}
	u, err := url.Parse(s.StringData["url"])
	if err != nil || u.Scheme != "s3" || u.Host == "" {
		t.Fatalf("Secret %s: url %q is not s3://BUCKET?…: %v", artifactStoreSecret, s.StringData["url"], err)
	}
	st := &artifactStore{root: t.TempDir(), bucket: u.Host}
	if err := os.Mkdir(filepath.Join(st.root, st.bucket), 0o755); err != nil {
		t.Fatal(err)
	}
	port, err := testbin.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, p, _ := strings.Cut(port, ":")
	addr := nodeIP.String() + ":" + p
	cmd := exec.Command(filepath.Join(binDir, testbin.S3Server), "--access", s.StringData["access-key-id"],
		"--secret", s.StringData["secret-access-key"], "--port", addr, "--region", cmp.Or(u.Query().Get("region"), "us-east-1"), st.root)
	cmd.Env = testbin.Env()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	listening := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "listening on") {
				listening <- true
			}
		}
		listening <- false
	}()
	select {
	case ok := <-listening:
		if !ok {
			t.Fatal("versitygw exited before it listened")
		}
	case <-time.After(waitTimeout):
		t.Fatalf("versitygw did not listen within %v", waitTimeout)
	}
	q := u.Query()
	q.Set("endpoint", "http://"+addr)
	u.RawQuery = q.Encode()
	st.env = "LEASEHOLD_ARTIFACT_STORE=" + u.String()
	return st
}

// objects returns the keys of the objects in the store's bucket.
func (st *artifactStore) objects(t *testing.T) []string {
	t.Helper()
	var keys []string
	dir := filepath.Join(st.root, st.bucket)
	err := filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		keys = append(keys, rel)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// String names the store for messages.
func (st *artifactStore) String() string { return fmt.Sprintf("versitygw (%s)", st.env) }
