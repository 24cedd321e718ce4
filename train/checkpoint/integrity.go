// integrity.go: the checksums a checkpoint carries and their verification,
// and the refusal of non-finite values.
//
// A version-3 file records, in its safetensors metadata, the CRC-32C
// (Castagnoli) of every tensor's bytes as stored (little-endian fp32) under
// ChecksumsKey, a JSON object from tensor name to eight lowercase hex
// digits, and the CRC-32C of the training-state JSON (the MetadataKey
// string) under StateChecksumKey. The tensors and the header stay plain
// safetensors, so other tools still read the file.
//
// Limits: CRC-32C detects accidental damage (every burst of up to 32
// flipped bits, so any one corrupted byte), not deliberate tampering; the
// checksum entries themselves are not checksummed, but a damaged entry
// fails to match and is reported as the tensor it names. Version-2 files
// carry no checksums and load unverified, with a warning.

package checkpoint

import (
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math"
	"slices"

	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// ChecksumsKey is the metadata entry holding each tensor's CRC-32C.
const ChecksumsKey = "lsp_offload.crc32c"

// StateChecksumKey is the metadata entry holding the CRC-32C of the
// training-state JSON.
const StateChecksumKey = "lsp_offload.state.crc32c"

// checksumVersion is the first format version whose files carry checksums.
const checksumVersion = 3

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksum is the CRC-32C of b as the metadata spells it.
func checksum(b []byte) string {
	return fmt.Sprintf("%08x", crc32.Checksum(b, castagnoli))
}

// Metadata returns the safetensors metadata of a checkpoint file holding
// tensors and the training state state (its JSON): the state and the
// checksums of it and of every tensor's Data, the very bytes
// safetensors.Write stores.
func Metadata(tensors []safetensors.Tensor, state string) map[string]string {
	sums := make(map[string]string, len(tensors))
	for _, t := range tensors {
		sums[t.Name] = checksum(t.Data)
	}
	return metadata(sums, state)
}

// metadata is Metadata from the tensors' checksums, name to hex.
func metadata(sums map[string]string, state string) map[string]string {
	// Keys sorted: the same bytes every time. A map of strings always
	// encodes (invalid UTF-8 is replaced), so the error is always nil.
	raw, _ := json.Marshal(sums)
	return map[string]string{
		MetadataKey:      state,
		StateChecksumKey: checksum([]byte(state)),
		ChecksumsKey:     string(raw),
	}
}

// verify checks the training state against its checksum and that every
// tensor of f has a checksum and every checksum a tensor, and returns the
// tensors' checksums, which Load then checks each tensor's bytes against
// as it reads them, before any value is used. It reports unverified (and
// no checksums) when f carries none and its state says it predates them
// (version 2 or older); a later version without them is an error. Every
// error names the file and the tensor, or the training state, at fault.
func verify(f *safetensors.File) (want map[string]string, unverified bool, err error) {
	sums, hasSums := f.Metadata[ChecksumsKey]
	stateSum, hasStateSum := f.Metadata[StateChecksumKey]
	if !hasSums && !hasStateSum {
		st, err := ReadState(f)
		if err != nil {
			return nil, false, err
		}
		if st.Version >= checksumVersion {
			return nil, false, fmt.Errorf("%s: format version %d without checksums (no %s in its metadata): the file is damaged or was altered",
				f.Path, st.Version, ChecksumsKey)
		}
		return nil, true, nil
	}
	state, ok := f.Metadata[MetadataKey]
	switch {
	case !ok:
		return nil, false, fmt.Errorf("%s: no training state in its metadata (not an lsp-train checkpoint, or a damaged one)", f.Path)
	case !hasStateSum:
		return nil, false, fmt.Errorf("%s: training state: no checksum (%s missing from its metadata)", f.Path, StateChecksumKey)
	case checksum([]byte(state)) != stateSum:
		return nil, false, fmt.Errorf("%s: training state: CRC-32C %s, the file records %q: the file is corrupted",
			f.Path, checksum([]byte(state)), stateSum)
	case !hasSums:
		return nil, false, fmt.Errorf("%s: no tensor checksums (%s missing from its metadata)", f.Path, ChecksumsKey)
	}
	if err := json.Unmarshal([]byte(sums), &want); err != nil {
		return nil, false, fmt.Errorf("%s: tensor checksums (%s): %w", f.Path, ChecksumsKey, err)
	}
	for _, name := range f.Names() {
		if _, ok := want[name]; !ok {
			return nil, false, fmt.Errorf("%s: tensor %s: no checksum in %s", f.Path, name, ChecksumsKey)
		}
	}
	names := make([]string, 0, len(want))
	for name := range want {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if _, ok := f.Info(name); !ok {
			return nil, false, fmt.Errorf("%s: tensor %s: has a checksum but is missing from the file", f.Path, name)
		}
	}
	return want, false, nil
}

// NonFinite describes the first NaN or infinity in v, or returns "" when
// every value is finite. When layout is not nil, v holds the parameters it
// lays out and the description names the parameter and the element within
// it ("transformer.h.0.ln_1.bias holds NaN at element 3"); otherwise it
// names the element of v ("NaN at element 3").
func NonFinite(v []float32, layout []model.Param) string { return nonFinite(v, 0, layout) }

// nonFinite is NonFinite of the chunk v of a longer array, its first
// element the array's element off.
func nonFinite(v []float32, off int, layout []model.Param) string {
	i := slices.IndexFunc(v, func(x float32) bool {
		return math.IsNaN(float64(x)) || math.IsInf(float64(x), 0)
	})
	if i < 0 {
		return ""
	}
	x := v[i]
	i += off
	for _, p := range layout {
		if i >= p.Offset && i < p.Offset+p.Len() {
			return fmt.Sprintf("%s holds %v at element %d", p.Name, x, i-p.Offset)
		}
	}
	return fmt.Sprintf("%v at element %d", x, i)
}
