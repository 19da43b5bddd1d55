package metrics

// #include <stdlib.h>
import "C"

import "github.com/ebitengine/purego"

var _ = purego.Dlopen
