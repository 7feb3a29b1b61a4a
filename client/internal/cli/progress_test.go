package cli

import (
	"testing"
	"time"
)

func TestRenderProgress(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		p     progress
		width int
		want  string
	}{
		{"a wide terminal shows the bar, counts, rate and ETA",
			progress{total: 200, succeeded: 118, failed: 2, rate: 12.5}, 80,
			"[##################............] 120/200 done, 2 failed  12 docs/s  ETA 6s"},
		{"an unknown width is taken as 80 columns",
			progress{total: 200, succeeded: 118, failed: 2, rate: 12.5}, 0,
			"[##################............] 120/200 done, 2 failed  12 docs/s  ETA 6s"},
		{"a slow rate shows a decimal and the ETA in seconds",
			progress{total: 10, succeeded: 5, rate: 0.5}, 50,
			"[######......] 5/10 done  0.5 docs/s  ETA 10s"},
		{"without a rate yet there is no ETA and the bar keeps its width",
			progress{total: 10, succeeded: 5}, 50,
			"[######......] 5/10 done"},
		{"a long wait shows the ETA in hours and minutes",
			progress{total: 100_000, succeeded: 1_000, rate: 10}, 100,
			"[........................................] 1000/100000 done  10 docs/s  ETA 2h45m"},
		{"cancelled jobs are counted as done and named",
			progress{total: 4, succeeded: 1, cancelled: 1, rate: 2}, 80,
			"[###############................] 2/4 done, 1 cancelled  2.0 docs/s  ETA 1s"},
		{"when every job is done there is no ETA",
			progress{total: 4, succeeded: 4, rate: 2}, 80,
			"[########################################] 4/4 done  2.0 docs/s"},
		{"a narrow terminal loses the bar first",
			progress{total: 200, succeeded: 120, rate: 12.5}, 45,
			"120/200 done  12 docs/s  ETA 6s"},
		{"a narrower one loses the rate and ETA next",
			progress{total: 200, succeeded: 118, failed: 2, rate: 12.5}, 30,
			"120/200 done, 2 failed"},
		{"the counts are cut to fit as a last resort",
			progress{total: 10, succeeded: 5}, 5,
			"5/10"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := renderProgress(tt.p, tt.width)
			if got != tt.want {
				t.Errorf("renderProgress = %q, want %q", got, tt.want)
			}
			width := tt.width
			if width <= 0 {
				width = defaultWidth
			}
			if len(got) >= width {
				t.Errorf("line is %d columns, want fewer than %d", len(got), width)
			}
		})
	}
}

func TestFormatETA(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0:                                "0s",
		1400 * time.Millisecond:          "1s",
		59 * time.Second:                 "59s",
		65 * time.Second:                 "1m05s",
		time.Hour - time.Second:          "59m59s",
		2*time.Hour + 45*time.Minute + 9: "2h45m",
	} {
		if got := formatETA(d); got != want {
			t.Errorf("formatETA(%v) = %q, want %q", d, got, want)
		}
	}
}
