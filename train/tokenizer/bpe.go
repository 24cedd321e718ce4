// bpe.go: the BPE model of Hugging Face's tokenizers: a word's characters
// (or, with byte fallback, its bytes as <0xNN> tokens) are merged pair by
// pair, lowest merge rank first and leftmost first among equal ranks, as
// the library's Word::merge_all does with its priority queue.

package tokenizer

import (
	"fmt"
	"sync"
	"unicode/utf8"
)

// mergeRule is what a pair of ids merges into, and when.
type mergeRule struct {
	rank int32 // the merge's line: lower merges first
	id   int32 // the merged token
}

type bpeModel struct {
	vocab        map[string]int32
	merges       map[uint64]mergeRule
	unk          int32 // -1: none (unknown characters are dropped)
	fuseUnk      bool
	byteFallback bool
	byteIDs      [256]int32 // <0xNN>, or -1 where the vocabulary lacks it
	ignoreMerges bool       // a word that is a token is taken whole

	cacheMu sync.RWMutex
	cache   map[string][]int32
}

// cacheLimit bounds the word cache; past it, words are no longer added
// (natural text repeats its words, so the first ones are the useful ones).
// Longer words than cacheWord are not kept: without a pre-tokenizer
// (SentencePiece style) a "word" is a whole text.
const (
	cacheLimit = 1 << 16
	cacheWord  = 64
)

func newBPE(vocab map[string]int32, merges [][2]string, unk string, fuseUnk, byteFallback, ignoreMerges bool) (*bpeModel, error) {
	m := &bpeModel{vocab: vocab, unk: -1, fuseUnk: fuseUnk, byteFallback: byteFallback, ignoreMerges: ignoreMerges,
		merges: make(map[uint64]mergeRule, len(merges)), cache: map[string][]int32{}}
	if unk != "" {
		id, ok := vocab[unk]
		if !ok {
			return nil, fmt.Errorf("model.unk_token %q is not in model.vocab", unk)
		}
		m.unk = id
	}
	for b := range m.byteIDs {
		m.byteIDs[b] = -1
		if id, ok := vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.byteIDs[b] = id
		}
	}
	for i, p := range merges {
		a, okA := vocab[p[0]]
		b, okB := vocab[p[1]]
		c, okC := vocab[p[0]+p[1]]
		if !okA || !okB || !okC {
			return nil, fmt.Errorf("model.merges[%d] (%q %q): a token is not in model.vocab", i, p[0], p[1])
		}
		if _, dup := m.merges[pairKey(a, b)]; !dup { // the first (lowest) rank wins, as in the library
			m.merges[pairKey(a, b)] = mergeRule{rank: int32(i), id: c}
		}
	}
	return m, nil
}

// pairKey is the merges map's key of the pair (a, b).
func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// symbol is one part of a word while merging: a token id, linked to its
// neighbours (-1: none). A merged-away symbol has dead set.
type symbol struct {
	id         int32
	prev, next int
	dead       bool
}

// candidate is a possible merge of the symbol at pos with the next one.
type candidate struct {
	rank, id int32
	pos      int
}

func (a candidate) before(b candidate) bool {
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.pos < b.pos
}

// candidates is a binary min-heap of candidates, typed rather than through
// container/heap, whose boxing of every element dominated long words.
type candidates []candidate

func (h *candidates) push(c candidate) {
	*h = append(*h, c)
	q := *h
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if !q[i].before(q[p]) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

func (h *candidates) pop() candidate {
	q := *h
	top := q[0]
	n := len(q) - 1
	q[0] = q[n]
	q = q[:n]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && q[l].before(q[m]) {
			m = l
		}
		if r < n && q[r].before(q[m]) {
			m = r
		}
		if m == i {
			break
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
	*h = q
	return top
}

// encode appends the ids of word to out.
func (m *bpeModel) encode(word string, out []int32) []int32 {
	if word == "" {
		return out
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return append(out, id)
		}
	}
	m.cacheMu.RLock()
	ids, ok := m.cache[word]
	m.cacheMu.RUnlock()
	if ok {
		return append(out, ids...)
	}
	ids = m.merge(m.symbols(word))
	m.cacheMu.Lock()
	if len(m.cache) < cacheLimit && len(word) <= cacheWord {
		m.cache[word] = ids
	}
	m.cacheMu.Unlock()
	return append(out, ids...)
}

// symbols splits word into its first symbols: one per character that is
// a token, else its bytes' tokens (byte fallback), else the unknown token
// (consecutive ones fused when fuse_unk), else nothing.
func (m *bpeModel) symbols(word string) []symbol {
	syms := make([]symbol, 0, len(word))
	add := func(id int32) {
		syms = append(syms, symbol{id: id, prev: len(syms) - 1, next: len(syms) + 1})
	}
	lastUnk := false
	for i := 0; i < len(word); {
		_, n := utf8.DecodeRuneInString(word[i:])
		ch := word[i : i+n]
		i += n
		if id, ok := m.vocab[ch]; ok {
			add(id)
			lastUnk = false
			continue
		}
		if m.byteFallback && m.hasBytes(ch) {
			for j := 0; j < len(ch); j++ {
				add(m.byteIDs[ch[j]])
			}
			lastUnk = false
			continue
		}
		if m.unk >= 0 {
			if !(m.fuseUnk && lastUnk) {
				add(m.unk)
			}
			lastUnk = true
		}
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	return syms
}

func (m *bpeModel) hasBytes(s string) bool {
	for j := 0; j < len(s); j++ {
		if m.byteIDs[s[j]] < 0 {
			return false
		}
	}
	return true
}

// merge applies the merges to syms and returns the resulting ids.
func (m *bpeModel) merge(syms []symbol) []int32 {
	var q candidates
	push := func(pos int) {
		next := syms[pos].next
		if next < 0 {
			return
		}
		if r, ok := m.merges[pairKey(syms[pos].id, syms[next].id)]; ok {
			q.push(candidate{rank: r.rank, id: r.id, pos: pos})
		}
	}
	for i := range syms {
		push(i)
	}
	for len(q) > 0 {
		c := q.pop()
		s := &syms[c.pos]
		if s.dead || s.next < 0 {
			continue
		}
		right := s.next
		// The pair at pos may have changed since c was queued.
		if r, ok := m.merges[pairKey(s.id, syms[right].id)]; !ok || r.id != c.id {
			continue
		}
		s.id = c.id
		s.next = syms[right].next
		syms[right].dead = true
		if s.next >= 0 {
			syms[s.next].prev = c.pos
		}
		if s.prev >= 0 {
			push(s.prev)
		}
		push(c.pos)
	}
	ids := make([]int32, 0, len(syms))
	for i := 0; i >= 0 && i < len(syms); i = syms[i].next {
		ids = append(ids, syms[i].id)
	}
	return ids
}
