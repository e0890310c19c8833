package wq

// TableWork returns how many arrays t's writers have built and how many
// entries those rebuilds visited (copied, or allocated and cleared).
func TableWork[T any](t *Table[T]) (rebuilds, work int) { return t.rebuilds, t.work }

// TableSlots returns the size of t's hashed array.
func TableSlots[T any](t *Table[T]) int {
	if tb := t.t.Load(); tb != nil {
		return len(tb.slots)
	}
	return 0
}

// DirectKeys is directKeys.
const DirectKeys = directKeys

// TableSlotKeys returns the key of each slot of t's hashed array (0:
// empty).
func TableSlotKeys[T any](t *Table[T]) []uint32 {
	tb := t.t.Load()
	if tb == nil {
		return nil
	}
	keys := make([]uint32, len(tb.slots))
	for i := range tb.slots {
		keys[i] = tb.slots[i].key.Load()
	}
	return keys
}
