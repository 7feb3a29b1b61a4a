package hostcheck

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestCheckHosts checks what a configured name may be: a host name or an
// IP address, with or without a port.
func TestCheckHosts(t *testing.T) {
	t.Parallel()
	for _, h := range []string{"", "a:b:c", "console.example:0", "console.example:http", "https://console.example/", "a b"} {
		if err := CheckHosts([]string{h}); err == nil {
			t.Errorf("CheckHosts(%q) = nil, want an error", h)
		}
	}
	if err := CheckHosts([]string{"console.example", "10.0.0.5:7071", "[fd00::5]:7071", "fd00::5"}); err != nil {
		t.Errorf("CheckHosts = %v, want nil", err)
	}
}
