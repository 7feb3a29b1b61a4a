package main

import (
	"strings"
	"testing"
)

func TestVerdict(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		lo, hi float64
		higher bool
		want   string
	}{
		{1.05, 1.10, true, "better"},
		{1.05, 1.10, false, "worse"},
		{0.90, 0.95, true, "worse"},
		{0.90, 0.95, false, "better"},
		{0.97, 1.05, true, "within noise"},
		{0.99, 1.01, false, "within noise"},
	} {
		if got := verdict(c.lo, c.hi, c.higher); got != c.want {
			t.Errorf("verdict(%v, %v, higher %v) = %q, want %q", c.lo, c.hi, c.higher, got, c.want)
		}
	}
}

func TestWriteComparison(t *testing.T) {
	t.Parallel()
	round := func(drain, cpu float64) []figure {
		return []figure{{figureDrain, drain, true}, {figureDrainCPU, cpu, false}}
	}
	runs := [2][][]figure{
		{round(10000, 100), round(11000, 110), round(9000, 90)},
		{round(12000, 80), round(13200, 88), round(10800, 72)},
	}
	var sb strings.Builder
	if err := writeComparison(&sb, config{rounds: 3, bin: "bin", compare: "old", renderers: 4, capacity: 64}, runs); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	for _, want := range []string{"drain docs/s      10000", "1.200", "1.200–1.200", "better", "0.800"} {
		if !strings.Contains(out, want) {
			t.Errorf("the comparison lacks %q:\n%s", want, out)
		}
	}
}
