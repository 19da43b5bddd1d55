package chunk

import (
	"fmt"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/internal/units"
)

// checkAhead checks Config.Ahead against what can hold the chunks made
// ahead: the reuse cache, the budget, and the device's memory.
func checkAhead(drv acl.Driver, cfg Config, size uintptr, maxCached int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("chunk: %w: Config.Ahead %d "+format, append([]any{acl.ErrInvalidParam, cfg.Ahead}, args...)...)
	}
	if cfg.Ahead > maxCached {
		if maxCached == 0 {
			return bad("needs the reuse cache, which Config.MaxCached %d disables", cfg.MaxCached)
		}
		return bad("exceeds the reuse cache's bound, %d chunks (Config.MaxCached; 0 means %d): chunks made ahead wait in the cache",
			maxCached, DefaultMaxCached)
	}
	bytes := uint64(cfg.Ahead) * uint64(size)
	if cfg.Budget > 0 && bytes > uint64(cfg.Budget) {
		return bad("chunks of %s (%s) exceed Config.Budget, %s", units.IEC(int64(size)), units.IEC(int64(bytes)), units.Bytes(cfg.Budget))
	}
	_, total, err := drv.GetMemInfo(acl.HBMMem)
	if err == nil && bytes > uint64(total) {
		return bad("chunks of %s (%s) exceed the device's memory, %s", units.IEC(int64(size)), units.IEC(int64(bytes)), units.IEC(int64(total)))
	}
	return nil
}
