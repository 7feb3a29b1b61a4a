package mutation

import "testing"

// TestTableFollowsTheConstants keeps the table and the constants in step:
// one entry per bug, at its constant's place, each with a name of its own.
func TestTableFollowsTheConstants(t *testing.T) {
	t.Parallel()
	if len(Table) != int(numBugs)-1 {
		t.Fatalf("the table has %d entries for %d bugs", len(Table), int(numBugs)-1)
	}
	seen := map[string]bool{}
	for i, in := range Table {
		if in.Bug != Bug(i+1) {
			t.Errorf("entry %d is bug %d", i, in.Bug)
		}
		if in.Name == "" || seen[in.Name] || in.Where == "" || in.Breaks == "" {
			t.Errorf("entry %d (%q) is incomplete or named twice", i, in.Name)
		}
		seen[in.Name] = true
		if b, err := Lookup(in.Name); err != nil || b != in.Bug || b.String() != in.Name {
			t.Errorf("Lookup(%q) = %v, %v", in.Name, b, err)
		}
	}
	if _, err := Lookup("no such bug"); err == nil {
		t.Error("Lookup of an unknown name: no error")
	}
}
