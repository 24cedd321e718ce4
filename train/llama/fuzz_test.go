package llama

import (
	"math"
	"os"
	"path/filepath"
	"testing"
)

// FuzzHFConfig: any config.json is either refused with an error or gives
// a valid architecture whose export reads back as itself and whose rotary
// frequencies are finite and positive; nothing panics.
func FuzzHFConfig(f *testing.F) {
	for _, name := range fixtureNames {
		raw, err := os.ReadFile(filepath.Join(fixtureDir(name), "config.json"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Add([]byte(`{"model_type":"mistral","hidden_size":64,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":4,` +
		`"num_key_value_heads":2,"vocab_size":9,"sliding_window":null,"eos_token_id":[1,2],"bos_token_id":null}`))
	f.Add([]byte(`{"model_type":"llama","hidden_size":64,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":4,` +
		`"vocab_size":9,"rope_theta":500000,"rope_scaling":{"type":"linear","factor":4}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := ParseHFConfig(raw)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted an invalid config: %v", err)
		}
		out, err := c.HFConfigDType("bfloat16")
		if err != nil {
			t.Fatalf("export of an accepted config: %v", err)
		}
		back, err := ParseHFConfig(out)
		if err != nil || !back.Equal(c) {
			t.Fatalf("export %s reads back as %+v, %v; want %+v", out, back, err, c)
		}
		if c.HS() <= 1<<12 {
			for i, v := range c.InvFreq() {
				if !(v > 0) || math.IsInf(float64(v), 0) {
					t.Fatalf("inv_freq[%d] = %v", i, v)
				}
			}
		}
	})
}
