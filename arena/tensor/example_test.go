package tensor_test

import (
	"fmt"
	"log"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/arena/tensor"
)

// Typed tensors: the bytes and the alignment follow from the element type
// and the shape; Float16 and BFloat16 convert from and to float32 on the
// way.
func ExampleAlloc() {
	a, err := arena.New(arena.Config{Reserve: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()

	x, err := tensor.Alloc[tensor.Float16](a, 2, 3)
	if err != nil {
		log.Fatal(err)
	}
	if err := tensor.CopyInFloat32(x, []float32{1, 2, 3, 0.1, 65504, 1e6}); err != nil {
		log.Fatal(err)
	}
	back := make([]float32, x.Len())
	if err := tensor.CopyOutFloat32(back, x); err != nil {
		log.Fatal(err)
	}
	fmt.Println(x.Shape(), x.Buffer().Len(), "bytes,", "aligned:", x.Ptr()%tensor.Align == 0)
	fmt.Println(back)

	ids, err := tensor.Alloc[int32](a, 4)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ids.CopyIn([]int32{1, 2, 3}) != nil) // not 4 elements
	// Output:
	// [2 3] 12 bytes, aligned: true
	// [1 2 3 0.099975586 65504 +Inf]
	// true
}
