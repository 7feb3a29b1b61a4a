package testbin

import (
	"net"
	"strconv"
	"testing"
)

func TestFreeAddrAvoidsEphemeralPorts(t *testing.T) {
	low := ephemeralLow()
	seen := make(map[string]bool)
	for range 20 {
		addr, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Errorf("FreeAddr returned %s twice", addr)
		}
		seen[addr] = true
		_, port, _ := net.SplitHostPort(addr)
		if p, _ := strconv.Atoi(port); low > 10100 && p >= low {
			t.Errorf("FreeAddr = %s, in the ephemeral range from %d", addr, low)
		}
	}
}
