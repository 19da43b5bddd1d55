package nccl

// SymbolNames returns every symbol the binding resolves.
func SymbolNames() []string {
	var names []string
	for _, s := range new(symbols).table() {
		names = append(names, s.name)
	}
	return names
}
