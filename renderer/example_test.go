package renderer_test

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"log/slog"
	"net"
	"os"

	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/coordinator"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
	"github.com/leasehold/leasehold/renderer"
)

// textPreviewer is a provider of its own: it previews a plain-text
// document as a small grey PNG, one row per line, lighter the longer the
// line, and refuses every other format for good.
type textPreviewer struct{}

// Render implements renderer.Provider.
func (textPreviewer) Render(ctx context.Context, in renderer.Input) (renderer.Output, error) {
	if in.Document.ContentType != "text/plain" {
		return renderer.Output{}, &renderer.Failure{
			Class:   leaseholdv1.FailureClass_FAILURE_CLASS_UNSUPPORTED_FORMAT,
			Message: "only text/plain is previewed",
		}
	}
	lines := bytes.Split(in.Document.Content, []byte("\n"))
	img := image.NewGray(image.Rect(0, 0, 32, len(lines)))
	for y, line := range lines {
		for x := range 32 {
			img.SetGray(x, y, color.Gray{Y: uint8(min(len(line)*16, 255))})
		}
	}
	var out bytes.Buffer
	if err := png.Encode(&out, img); err != nil {
		return renderer.Output{}, err
	}
	return renderer.Output{Content: out.Bytes(), ContentType: "image/png"}, nil
}

// A renderer built on package renderer with a provider of its own, working
// for a coordinator started in this process with the development tokens
// (which it accepts only on loopback). The worker completes the text
// document with its preview, and the PDF with the provider's permanent
// failure, which ends that job at once.
func Example() {
	dir, err := os.MkdirTemp("", "leasehold-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	coord, err := coordinator.New(coordinator.Config{DataDir: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer coord.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	go coord.Serve(lis)
	addr := lis.Addr().String()

	w, err := renderer.New(renderer.Config{
		Coordinator: addr,
		ID:          "text-previewer-1",
		Token:       "dev-renderer",
		Provider:    textPreviewer{},
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, drain := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	defer func() {
		drain() // Run drains: nothing is in flight, so it returns at once
		if err := <-ran; err != nil {
			fmt.Println(err)
		}
	}()

	cl, err := client.Dial(addr, client.WithToken("dev-alpha"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	resp, err := cl.SubmitBatch(ctx, "alpha", "example-1", []*leaseholdv1.Document{
		{Name: "notes.txt", ContentType: "text/plain", Content: []byte("one\nthree\nfive")},
		{Name: "report.pdf", ContentType: "application/pdf", Content: []byte("%PDF-1.7")},
	}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, err := range cl.FollowBatch(ctx, resp.GetBatch().GetId(), client.FollowOptions{TerminalOnly: true}) {
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	for _, id := range resp.GetBatch().GetJobIds() {
		j, err := cl.GetJob(ctx, id)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(j.GetDocument().GetName(), j.GetPhase(), j.GetTerminalReason())
		if j.GetPhase() != leaseholdv1.Phase_PHASE_SUCCEEDED {
			continue
		}
		var preview bytes.Buffer
		if _, err := cl.DownloadArtifact(ctx, id, &preview); err != nil {
			fmt.Println(err)
			return
		}
		img, err := png.Decode(&preview)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("  preview", img.Bounds().Size(), "first row grey", img.At(0, 0).(color.Gray).Y)
	}
	// Output:
	// notes.txt PHASE_SUCCEEDED TERMINAL_REASON_SUCCEEDED
	//   preview (32,3) first row grey 48
	// report.pdf PHASE_FAILED TERMINAL_REASON_UNSUPPORTED_FORMAT
}
