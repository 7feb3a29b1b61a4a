package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// progress is what the submit --wait progress line shows.
type progress struct {
	total                        int
	succeeded, failed, cancelled int
	// rate is jobs finished per second since the wait began; 0 while unknown.
	rate float64
}

// done is the number of jobs in a terminal phase.
func (p progress) done() int { return p.succeeded + p.failed + p.cancelled }

// Layout of the progress line.
const (
	// defaultWidth is assumed when the terminal's width is unknown.
	defaultWidth = 80
	// minBarWidth is the narrowest bar worth drawing; below it the line
	// shows the counts only.
	minBarWidth = 10
	// maxBarWidth keeps the bar readable on wide terminals.
	maxBarWidth = 40
)

// speedReserve is the room kept for the rate and ETA, so that the bar
// keeps its width as they appear and change: "  999 docs/s  ETA 59m59s".
const speedReserve = len("  999 docs/s  ETA 59m59s")

// renderProgress lays p out on one line of fewer than width columns (the
// last column is left free so that the terminal never wraps), as in
//
//	[########............] 120/200 done, 2 failed  12.5 docs/s  ETA 6s
//
// The bar's width depends on the width and the total, not on the progress,
// so it stays put while the counts grow. When the line does not fit, the
// bar goes first, then the rate and ETA, then the end of the counts. A
// width of 0 or less means defaultWidth. Pure: it reads no clock.
func renderProgress(p progress, width int) string {
	if width <= 0 {
		width = defaultWidth
	}
	avail := width - 1
	done := p.done()
	counts := func(done int) string {
		s := fmt.Sprintf("%d/%d done", done, p.total)
		if p.failed > 0 {
			s += fmt.Sprintf(", %d failed", p.failed)
		}
		if p.cancelled > 0 {
			s += fmt.Sprintf(", %d cancelled", p.cancelled)
		}
		return s
	}
	text := counts(done)
	if p.rate > 0 {
		speed := "  " + formatRate(p.rate) + " docs/s"
		if done < p.total {
			eta := time.Duration(float64(p.total-done) / p.rate * float64(time.Second))
			speed += "  ETA " + formatETA(eta)
		}
		if len(text)+len(speed) <= avail {
			text += speed
		}
	}
	if len(text) > avail {
		return text[:max(avail, 0)]
	}
	// The widest the text gets at this total, with room for rate and ETA.
	barWidth := min(maxBarWidth, avail-len("[] ")-len(counts(p.total))-speedReserve, avail-len("[] ")-len(text))
	if barWidth < minBarWidth {
		return text
	}
	filled := 0
	if p.total > 0 {
		filled = min(barWidth, done*barWidth/p.total)
	}
	return "[" + strings.Repeat("#", filled) + strings.Repeat(".", barWidth-filled) + "] " + text
}

// formatRate shows a rate with one decimal below 10, none above.
func formatRate(r float64) string {
	if r < 10 {
		return fmt.Sprintf("%.1f", r)
	}
	return fmt.Sprintf("%.0f", r)
}

// formatETA shows a duration in whole seconds as 42s, 3m05s or 2h03m.
func formatETA(d time.Duration) string {
	s := int64(d.Round(time.Second) / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	default:
		return fmt.Sprintf("%dh%02dm", s/3600, s%3600/60)
	}
}

// progressBar redraws the progress line in place on a terminal with a
// carriage return, fitting the terminal's width at each draw. It is used
// from one goroutine.
type progressBar struct {
	w     io.Writer
	env   Env
	total int

	started   bool
	start     time.Time
	startDone int
	lastLen   int
}

func newProgressBar(w io.Writer, env Env, total int) *progressBar {
	return &progressBar{w: w, env: env, total: total}
}

// draw shows the sum of two count sets: the finished batches' and the
// current batch's. The rate counts the jobs finished since the first draw.
func (p *progressBar) draw(base, cur map[leaseholdv1.Phase]uint32) {
	get := func(ph leaseholdv1.Phase) int { return int(base[ph] + cur[ph]) }
	pr := progress{
		total:     p.total,
		succeeded: get(leaseholdv1.Phase_PHASE_SUCCEEDED),
		failed:    get(leaseholdv1.Phase_PHASE_FAILED),
		cancelled: get(leaseholdv1.Phase_PHASE_CANCELLED),
	}
	now := p.env.now()
	if !p.started {
		p.started, p.start, p.startDone = true, now, pr.done()
	}
	if elapsed := now.Sub(p.start); elapsed > 0 && pr.done() > p.startDone {
		pr.rate = float64(pr.done()-p.startDone) / elapsed.Seconds()
	}
	width := 0
	if p.env.TerminalWidth != nil {
		width = p.env.TerminalWidth(p.w)
	}
	line := renderProgress(pr, width)
	pad := ""
	if len(line) < p.lastLen {
		pad = strings.Repeat(" ", p.lastLen-len(line))
	}
	p.lastLen = len(line)
	fmt.Fprint(p.w, "\r"+line+pad)
}

// clear blanks the line, so that a message can be printed in its place;
// the next draw starts a fresh line.
func (p *progressBar) clear() {
	if p.lastLen > 0 {
		fmt.Fprint(p.w, "\r"+strings.Repeat(" ", p.lastLen)+"\r")
		p.lastLen = 0
	}
}

// finish ends the bar's line.
func (p *progressBar) finish() { fmt.Fprintln(p.w) }
