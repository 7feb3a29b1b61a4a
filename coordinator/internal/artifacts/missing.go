package artifacts

import (
	"context"
	"errors"
	"sync"
)

// Wanted is an object a caller needs, with the size it must have.
type Wanted struct {
	Key
	Size int64
}

// findParallel is how many objects FindMissing looks for at once.
const findParallel = 16

// FindMissing looks for every object of wanted in st, a few at a time,
// and returns those st does not hold with their size, in the order given.
// The error is a store that did not answer (wrapping ErrUnavailable): the
// objects were then not all looked for.
func FindMissing(ctx context.Context, st Store, wanted []Wanted) ([]Wanted, error) {
	missing := make([]bool, len(wanted))
	errs := make([]error, len(wanted))
	sem := make(chan struct{}, findParallel)
	var wg sync.WaitGroup
	for i, w := range wanted {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			info, err := st.Stat(ctx, w.Key)
			switch {
			case errors.Is(err, ErrNotFound):
				missing[i] = true
			case err != nil:
				errs[i] = err
			default:
				missing[i] = info.Size != w.Size || (info.SHA256 != "" && info.SHA256 != w.Digest)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	var out []Wanted
	for i, w := range wanted {
		if missing[i] {
			out = append(out, w)
		}
	}
	return out, nil
}
