// lora mode's adapters in a run: --adapter read before the memory plan
// (its rank and targets size it), uploaded before the engine's Init, and
// written beside each Hugging Face export as a PEFT adapter directory.

package train

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lora"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// readAdapter reads --adapter for the model, and takes its rank, alpha,
// dropout and targets as the run's, saying so when they replace flags'
// values.
func (r *run) readAdapter() error {
	if r.cfg.Adapter == "" {
		return nil
	}
	idx, err := model.NewIndex(r.mc)
	if err != nil {
		return fmt.Errorf("--adapter: %w", err)
	}
	ad, err := lora.ReadAdapter(r.cfg.Adapter, idx)
	if err != nil {
		return flagErr("adapter", "%v", err)
	}
	if ad.Cfg.Dropout != 0 {
		// The engine's adapters take their input as it is; the adapter
		// goes on training without dropout rather than not at all.
		r.log.Warn("--adapter: lora_dropout is not applied (only 0 is supported); training without it", "adapter", r.cfg.Adapter, "lora_dropout", ad.Cfg.Dropout)
		ad.Cfg.Dropout = 0
	}
	r.cfg.LoRAR, r.cfg.LoRAAlpha, r.cfg.LoRADropout = ad.Cfg.R, ad.Cfg.Alpha, 0
	r.cfg.LoRATargets = strings.Join(ad.Cfg.Targets, ",")
	r.log.Info("lora adapter", "adapter", r.cfg.Adapter, "r", ad.Cfg.R, "alpha", ad.Cfg.Alpha, "targets", r.cfg.LoRATargets, "modules", len(ad.Sites))
	r.adapter = ad
	return nil
}

// adapterDir is where the PEFT adapter of the Hugging Face export at dir
// goes: beside it, hf/ -> adapter/, hf-step-000100/ -> adapter-step-000100/.
func adapterDir(dir string) string {
	base := filepath.Base(dir)
	return filepath.Join(filepath.Dir(dir), "adapter"+strings.TrimPrefix(base, "hf"))
}

// exportAdapters writes the Hugging Face directory at dir with the
// adapters merged into the frozen weights (PEFT's merge_and_unload: a
// model transformers loads alone), streamed from the device as every
// export is, and the adapters themselves as a PEFT adapter directory
// beside it (adapterDir), which peft.PeftModel.from_pretrained loads onto
// --model.
func (r *run) exportAdapters(dir string) error {
	st := r.eng.Adapters()
	ad, err := st.Download(r.s)
	if err != nil {
		return fmt.Errorf("export: adapters: %w", err)
	}
	idx, err := model.NewIndex(r.mc)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	fetch, err := lora.MergeFetch(r.fetchParams, idx, ad)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := catalog.ExportFrom(r.mc, dir, fetch, r.src, r.tok); err != nil {
		return err
	}
	if err := lora.WriteAdapter(adapterDir(dir), ad, r.cfg.Model); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	return nil
}

// usesAdapters says whether the run's exports merge adapters.
func (r *run) usesAdapters() bool {
	return r.cfg.Mode == engine.LoRA && r.eng != nil && r.eng.Adapters() != nil
}
