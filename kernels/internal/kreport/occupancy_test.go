package kreport

import "testing"

// Hand-computed cases, following cuda_occupancy.h step by step.
func TestTheoretical(t *testing.T) {
	arch := func(name string) Arch {
		a, ok := ArchByName(name)
		if !ok {
			t.Fatalf("no arch %s", name)
		}
		return a
	}
	cases := []struct {
		name                string
		arch                string
		regs, threads, smem int
		blocks, warps       int
		limiter             string
		percent             int
	}{
		// gemm: 128 regs = 4096 a warp, 4 warps a sub-partition, 16 a SM,
		// 2 blocks of 8 warps; shared 40976+1024 -> 42112: 3 on sm_80.
		{"gemm sm_80", "sm_80", 128, 256, 40976, 2, 16, "regs", 25},
		// sm_86: 100 KiB / 42112 = 2 blocks, as many as registers allow;
		// registers are checked first, so they are named.
		{"gemm sm_86", "sm_86", 128, 256, 40976, 2, 16, "regs", 33},
		// 255 regs -> 8160 -> 8192 a warp: 2 warps a sub-partition, 8 a
		// SM, 2 blocks of 4 warps.
		{"attention sm_90", "sm_90", 255, 128, 46464, 2, 8, "regs", 13},
		// 32 regs, 256 threads: 1024 a warp, 16 warps a sub-partition, 64 a
		// SM = all of sm_80's; the warp limit binds first.
		{"elementwise sm_80", "sm_80", 32, 256, 0, 8, 64, "warps", 100},
		// sm_86 allows 48 warps: 6 blocks of 8.
		{"elementwise sm_86", "sm_86", 32, 256, 0, 6, 48, "warps", 100},
		// 64 threads of 16 registers: 2 warps a block, 32 blocks by warps
		// on sm_80 (32 allowed); on sm_86, 24 by warps but 16 by the block
		// limit: 32 of 48 warps.
		{"small blocks sm_80", "sm_80", 16, 64, 0, 32, 64, "warps", 100},
		{"small blocks sm_86", "sm_86", 16, 64, 0, 16, 32, "blocks", 67},
		// 48 KiB static: 49152+1024 = 50176 a block; sm_86: 102400/50176 =
		// 2 blocks of 4 warps = 8 of 48.
		{"shared sm_86", "sm_86", 32, 128, 48 << 10, 2, 8, "smem", 17},
		// sm_90: 233472/50176 = 4.
		{"shared sm_90", "sm_90", 32, 128, 48 << 10, 4, 16, "smem", 25},
		// 1000 bytes + 1024 = 2024 -> 2048 (128-byte units): 50 blocks'
		// worth on sm_86; 40 registers = 1280 a warp, 12 warps a
		// sub-partition, 48 a SM; 192 threads are 6 warps: 8 blocks by
		// warps and by registers, warps named first.
		{"rounding sm_86", "sm_86", 40, 192, 1000, 8, 48, "warps", 100},
	}
	for _, c := range cases {
		o, err := Theoretical(arch(c.arch), c.regs, c.threads, c.smem)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if o.Blocks != c.blocks || o.Warps != c.warps || o.Limiter != c.limiter || int(o.Ratio*100+0.5) != c.percent {
			t.Errorf("%s: got %d blocks, %d warps, %s, %s; want %d, %d, %s, %d%%",
				c.name, o.Blocks, o.Warps, o.Limiter, o, c.blocks, c.warps, c.limiter, c.percent)
		}
	}
}

func TestTheoreticalRefuses(t *testing.T) {
	a := Arches[0]
	for _, c := range []struct{ regs, threads, smem int }{
		{256, 128, 0},     // more than 255 registers
		{32, 0, 0},        // no threads
		{32, 1025, 0},     // too many threads
		{255, 1024, 0},    // 1024 x 255 registers exceed a block's 64K
		{32, 128, 200000}, // more shared memory than a block may have
	} {
		if o, err := Theoretical(a, c.regs, c.threads, c.smem); err == nil {
			t.Errorf("%+v: got %v, want an error", c, o)
		}
	}
}
