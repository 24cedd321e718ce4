// Carver: consecutive views carved out of one allocation.

package backend

// Carver hands out consecutive views of one allocation, so that a model or
// an engine can keep all its tensors of one kind in a single buffer.
type Carver struct {
	T   Tensor // the allocation
	Off int    // elements handed out so far
}

// Next returns the next view, of the given shape.
func (c *Carver) Next(shape ...int) Tensor {
	n := 1
	for _, s := range shape {
		n *= s
	}
	v := c.T.Slice(c.Off, n, shape...)
	c.Off += n
	return v
}
