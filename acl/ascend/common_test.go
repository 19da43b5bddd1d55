package ascend_test

import "github.com/vmarena/vmarena/acl"

// Helpers of the tests on the double and on hardware.

const g = acl.HugePageSize

func prop(dev int32) *acl.PhysicalMemProp {
	p := acl.DeviceProp(dev, acl.HBMMemHuge)
	return &p
}
