package cli

import (
	"strings"
	"testing"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/client/limits"
)

// TestSubmitRequestIDBoundIsTheCoordinators checks that the CLI refuses a
// request id exactly when its first batch's id (ID-0) would be over the
// coordinator's limit, the bound the client library applies, and not at a
// bound of its own.
func TestSubmitRequestIDBoundIsTheCoordinators(t *testing.T) {
	t.Parallel()
	longest := strings.Repeat("r", limits.MaxRequestIDBytes-len("-0"))
	if got := len(client.BatchRequestID(longest, 0)); got != limits.MaxRequestIDBytes {
		t.Fatalf("batch id of the longest request id is %d bytes, want %d", got, limits.MaxRequestIDBytes)
	}
	opts := func(id string) *submitOpts {
		return &submitOpts{RequestID: id, Paths: []string{"a.pdf"}, MaxBatchDocuments: 1, MaxBatchInlineBytes: 1, MaxBatchBytes: 1}
	}
	if err := opts(longest).Validate(); err != nil {
		t.Errorf("Validate(%d-byte request id) = %v, want nil", len(longest), err)
	}
	err := opts(longest + "r").Validate()
	if err == nil || !strings.Contains(err.Error(), "at most 126 bytes") {
		t.Errorf("Validate(%d-byte request id) = %v, want a usage error naming 126 bytes", len(longest)+1, err)
	}
}
