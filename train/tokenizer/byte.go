// byte.go: the byte tokenizer. Every byte of the UTF-8 text is one id
// (0..255) and id 256 ends a sequence, so any text round-trips exactly,
// including invalid UTF-8. Sequences are long (one id per byte); it suits
// small models and the synthetic tasks.

package tokenizer

// byteEOS is the end-of-sequence id of the byte tokenizer.
const byteEOS = 256

type byteTokenizer struct{}

// Byte returns the byte tokenizer: ids 0..255 are the bytes, EOS is 256,
// VocabSize is 257.
func Byte() Tokenizer { return byteTokenizer{} }

func (byteTokenizer) Name() string   { return "byte" }
func (byteTokenizer) EOS() int32     { return byteEOS }
func (byteTokenizer) VocabSize() int { return byteEOS + 1 }

func (byteTokenizer) Encode(s string) []int32 {
	ids := make([]int32, len(s))
	for i := 0; i < len(s); i++ {
		ids[i] = int32(s[i])
	}
	return ids
}

func (byteTokenizer) Decode(ids []int32) string {
	buf := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id >= 0 && id < 256 {
			buf = append(buf, byte(id))
		}
	}
	return string(buf)
}
