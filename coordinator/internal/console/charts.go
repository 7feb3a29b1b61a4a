package console

import (
	"fmt"
	"strings"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// chart is an inline SVG chart of one team's last hour, drawn on the
// server: a line for queue depth, stacked bars for finished jobs. Its
// title and description say in words what it draws, for screen readers
// (the table beside it has the same figures).
type chart struct {
	ID          string
	Title, Desc string
	Width       int
	Height      int
	// Line is a polyline's points ("x,y x,y ..."), for depth.
	Line string
	// Bars are the throughput bars.
	Bars []bar
	// Max is the value of the top of the chart.
	Max uint32
}

// bar is one rectangle of a bar chart; Class picks its colour.
type bar struct {
	X, Y, W, H int
	Class      string
}

// Chart geometry.
const (
	chartWidth  = 300
	chartHeight = 80
	chartTop    = 4
)

// depthChart draws a team's queue depth over the last minutes.
func depthChart(t *leaseholdv1.TeamOverview) chart {
	ms := t.GetMinutes()
	c := chart{ID: "depth-" + t.GetTeam(), Width: chartWidth, Height: chartHeight, Max: 1}
	for _, m := range ms {
		c.Max = max(c.Max, m.GetQueueDepth())
	}
	var pts []string
	for i, m := range ms {
		x := i * chartWidth / max(len(ms)-1, 1)
		y := chartHeight - int(m.GetQueueDepth())*(chartHeight-chartTop)/int(c.Max)
		pts = append(pts, fmt.Sprintf("%d,%d", x, y))
	}
	c.Line = strings.Join(pts, " ")
	c.Title = fmt.Sprintf("Queue depth of team %s, last %d minutes", t.GetTeam(), len(ms))
	c.Desc = fmt.Sprintf("Ready jobs waiting, from %d to %d now; highest %d.", first(ms).GetQueueDepth(), t.GetQueueDepth(), c.Max)
	return c
}

// throughputChart draws a team's succeeded and failed jobs per minute.
func throughputChart(t *leaseholdv1.TeamOverview) chart {
	ms := t.GetMinutes()
	c := chart{ID: "throughput-" + t.GetTeam(), Width: chartWidth, Height: chartHeight, Max: 1}
	var ok, failed uint32
	for _, m := range ms {
		c.Max = max(c.Max, m.GetSucceeded()+m.GetFailed())
		ok += m.GetSucceeded()
		failed += m.GetFailed()
	}
	w := max(chartWidth/max(len(ms), 1), 1)
	for i, m := range ms {
		x := i * w
		hs := int(m.GetSucceeded()) * (chartHeight - chartTop) / int(c.Max)
		hf := int(m.GetFailed()) * (chartHeight - chartTop) / int(c.Max)
		if hs > 0 {
			c.Bars = append(c.Bars, bar{X: x, Y: chartHeight - hs, W: max(w-1, 1), H: hs, Class: "ok"})
		}
		if hf > 0 {
			c.Bars = append(c.Bars, bar{X: x, Y: chartHeight - hs - hf, W: max(w-1, 1), H: hf, Class: "failed"})
		}
	}
	c.Title = fmt.Sprintf("Finished jobs per minute of team %s, last %d minutes", t.GetTeam(), len(ms))
	c.Desc = fmt.Sprintf("%d succeeded and %d failed in all; at most %d in one minute.", ok, failed, c.Max)
	return c
}

func first(ms []*leaseholdv1.MinuteStats) *leaseholdv1.MinuteStats {
	if len(ms) == 0 {
		return nil
	}
	return ms[0]
}
