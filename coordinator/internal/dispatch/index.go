package dispatch

import "math/bits"

// jobIndex maps every queued job to its position in its team's queue. It is an
// open-addressing hash table with linear probing, kept apart from Go's map for
// its memory locality.
//
// When job ids come from a counter, the jobs pushed together (and later popped
// together) have neighbouring ids. The hash keeps runs of blockSize
// consecutive ids in consecutive slots and scatters only whole blocks, so a
// steady push-and-pop stream walks through a few hot cache lines instead of
// missing the cache on every call, however large the backlog. Any other id
// pattern still spreads evenly over the blocks: ids that share a block never
// collide with each other.
//
// Deletion shifts the following entries back instead of leaving tombstones,
// and the table grows at three quarters full and shrinks at one eighth, so
// its memory stays proportional to the jobs queued now.
type jobIndex struct {
	slots []indexSlot
	count int
	// shift turns the scrambled block number into a block index of the table.
	shift uint
}

// indexSlot is one slot of a jobIndex.
type indexSlot struct {
	job uint64
	// pos is the job's queue position plus one; zero marks an empty slot.
	pos uint64
}

const (
	// blockBits is the log2 of how many consecutive job ids share a block of
	// neighbouring slots (16 slots of 16 bytes: four cache lines).
	blockBits = 4
	blockSize = 1 << blockBits
	// minIndexSlots is the smallest table allocated.
	minIndexSlots = 64
	// fibonacci is 2^64 divided by the golden ratio, the multiplier that
	// scrambles block numbers (Knuth's multiplicative hashing).
	fibonacci = 0x9E3779B97F4A7C15
)

// home returns the slot where the search for job starts.
func (ix *jobIndex) home(job uint64) uint64 {
	block := ((job >> blockBits) * fibonacci) >> ix.shift
	return block<<blockBits | job&(blockSize-1)
}

// get returns job's position and whether job is in the index.
func (ix *jobIndex) get(job uint64) (uint64, bool) {
	if ix.count == 0 {
		return 0, false
	}
	mask := uint64(len(ix.slots) - 1)
	for i := ix.home(job); ; i = (i + 1) & mask {
		s := &ix.slots[i]
		if s.pos == 0 {
			return 0, false
		}
		if s.job == job {
			return s.pos - 1, true
		}
	}
}

// set records job at pos, adding job or moving it.
func (ix *jobIndex) set(job, pos uint64) {
	if (ix.count+1)*4 > len(ix.slots)*3 {
		ix.resize(max(minIndexSlots, 2*len(ix.slots)))
	}
	mask := uint64(len(ix.slots) - 1)
	for i := ix.home(job); ; i = (i + 1) & mask {
		s := &ix.slots[i]
		if s.pos == 0 {
			*s = indexSlot{job: job, pos: pos + 1}
			ix.count++
			return
		}
		if s.job == job {
			s.pos = pos + 1
			return
		}
	}
}

// delete removes job, which must be in the index.
func (ix *jobIndex) delete(job uint64) {
	mask := uint64(len(ix.slots) - 1)
	i := ix.home(job)
	for ix.slots[i].job != job || ix.slots[i].pos == 0 {
		i = (i + 1) & mask
	}
	// Shift back every later entry of the run whose home does not lie
	// (cyclically) after the hole, so that no search stops early at it.
	for j := (i + 1) & mask; ix.slots[j].pos != 0; j = (j + 1) & mask {
		if (j-ix.home(ix.slots[j].job))&mask >= (j-i)&mask {
			ix.slots[i] = ix.slots[j]
			i = j
		}
	}
	ix.slots[i] = indexSlot{}
	ix.count--
	if len(ix.slots) > minShrink && ix.count*8 < len(ix.slots) {
		ix.resize(len(ix.slots) / 2)
	}
}

// resize moves the entries into a table of n slots, a power of two.
func (ix *jobIndex) resize(n int) {
	old := ix.slots
	ix.slots = make([]indexSlot, n)
	ix.count = 0
	ix.shift = 64 - uint(bits.TrailingZeros(uint(n))-blockBits)
	for _, s := range old {
		if s.pos != 0 {
			ix.set(s.job, s.pos-1)
		}
	}
}
