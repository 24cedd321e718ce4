package metrics

// ProfileEvent is the Event of a profiled step's record (lsp-train
// profile; package train/profile measures it).
const ProfileEvent = "profile"

// Profile is where one step's time went, in seconds. Device figures are
// sums of op times measured by a pair of events around each op on its
// stream; host figures are wall-clock times. The keys of Phases and
// Families are package train/profile's phase names and train/trace's
// family names.
type Profile struct {
	Mode     string `json:"mode"`
	Backend  string `json:"backend"`
	Schedule string `json:"schedule"`
	// Wall is the whole step (data, projector check, engine step);
	// Engine the engine's Step; Check the projector check's wall time
	// (0 when none was due); Device the sum of every op's time.
	Wall   float64 `json:"wall_s"`
	Engine float64 `json:"engine_s"`
	Check  float64 `json:"check_s"`
	Device float64 `json:"device_s"`
	// Phases are device time by phase plus "host-adam", the host Adam
	// nodes' wall time summed (they may overlap one another).
	Phases map[string]float64 `json:"phases_s"`
	// Families are device time by op family; FamilyOps their op counts.
	Families  map[string]float64 `json:"families_s"`
	FamilyOps map[string]int     `json:"family_ops"`
	// Busy and Idle are each stream's ("host": the host Adam nodes,
	// overlapping spans merged) busy time during the engine step and
	// Engine minus that.
	Busy map[string]float64 `json:"busy_s"`
	Idle map[string]float64 `json:"idle_s"`
	Ops  int                `json:"ops"`
}
