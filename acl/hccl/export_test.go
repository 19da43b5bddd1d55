package hccl

// SymbolNames returns every symbol the binding resolves, the zero-copy
// group included.
func SymbolNames() []string {
	var names []string
	for _, s := range new(symbols).table() {
		names = append(names, s.name)
	}
	for _, s := range new(zeroCopy).table() {
		names = append(names, s.name)
	}
	return names
}
