package units

import "testing"

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 bytes", 100: "100 bytes", 4096: "4096 bytes (4 KiB)", 3 << 20: "3145728 bytes (3 MiB)",
		2 << 30: "2147483648 bytes (2 GiB)", 1536 << 20: "1610612736 bytes (1.5 GiB)", 1 << 40: "1099511627776 bytes (1 TiB)",
		-4096: "-4096 bytes (-4 KiB)",
	} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
	if got := IEC(512); got != "512 B" {
		t.Errorf("IEC(512) = %q", got)
	}
	if got := Ubytes(1 << 63); got != "9223372036854775808 bytes" {
		t.Errorf("Ubytes(1<<63) = %q", got)
	}
}
