package backend

import "testing"

func BenchmarkCheckCall(b *testing.B) {
	const N, C = 512, 768
	t := func(n int) Tensor { return Tensor{Buf: idBuf{1}, Shape: []int{n}, DType: F32} }
	live := func(string, string, Tensor) error { return nil }
	for b.Loop() {
		c := Calls.LayerNormBackward(t(N*C), t(C), t(C), t(N*C), t(N*C), t(C), t(N), t(N), t(LayerNormBackwardScratch(N, C)), N, C)
		if _, err := CheckCall(c, "cpu", "layernorm backward", live); err != nil {
			b.Fatal(err)
		}
	}
}
