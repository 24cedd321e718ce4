// positions.go: the per-token positions of packed rows (--pack), the one
// extra input of the ops that depend on where a token sits in its sequence
// (EncoderForward/Backward, AttentionForward/Backward, RoPEForward/
// Backward).
//
// A packed row holds several documents end to end. pos, I32 [B,T], is each
// token's position within its document: 0 at a document's first token,
// one more than its predecessor's otherwise. From it alone every op knows
// what it needs: the position embedding row (GPT-2's wpe) and the rotation
// angle (RoPE) are pos's, and query t attends keys t-pos[b,t]..t, its own
// document's, so no list of boundaries travels beside it. An absent pos
// (nil Buf) is 0..T-1 in every row, today's unpacked rows, and every op
// then runs its unpacked code path with unchanged bits.

package backend

import "fmt"

// CheckPositions checks that pos (at least B*T) is a valid packing of B
// rows of T tokens: every row starts a document (pos 0) and every other
// token either starts one or follows its predecessor (pos[t-1]+1). Kernels
// cannot report a bad position; the CPU backend refuses one with this.
func CheckPositions(pos []int32, B, T int) error {
	if len(pos) < B*T {
		return fmt.Errorf("positions: %d, want B*T = %d", len(pos), B*T)
	}
	for b := range B {
		row := pos[b*T : (b+1)*T]
		for t, p := range row {
			if p != 0 && (t == 0 || p != row[t-1]+1) {
				return fmt.Errorf("positions: row %d token %d has position %d, want 0 (a new document) or %d", b, t, p, prevPlusOne(row, t))
			}
		}
	}
	return nil
}

func prevPlusOne(row []int32, t int) int32 {
	if t == 0 {
		return 0
	}
	return row[t-1] + 1
}
