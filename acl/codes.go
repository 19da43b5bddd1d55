package acl

import "fmt"

// aclError values (acl_base_rt.h, rt_error_codes.h).
const (
	Success                    int32 = 0
	ErrCodeInvalidParam        int32 = 100000 // ACL_ERROR_INVALID_PARAM
	ErrCodeUninitialize        int32 = 100001 // ACL_ERROR_UNINITIALIZE
	ErrCodeRepeatInitialize    int32 = 100002 // ACL_ERROR_REPEAT_INITIALIZE
	ErrCodeRepeatFinalize      int32 = 100037 // ACL_ERROR_REPEAT_FINALIZE
	ErrCodeBadAlloc            int32 = 200000 // ACL_ERROR_BAD_ALLOC
	ErrCodeAPINotSupport       int32 = 200001 // ACL_ERROR_API_NOT_SUPPORT
	ErrCodeInvalidDevice       int32 = 200002 // ACL_ERROR_INVALID_DEVICE
	ErrCodeAddressUnaligned    int32 = 200003 // ACL_ERROR_MEMORY_ADDRESS_UNALIGNED
	ErrCodeInvalidResource     int32 = 200005 // ACL_ERROR_INVALID_RESOURCE_HANDLE
	ErrCodeFeatureUnsupported  int32 = 200006 // ACL_ERROR_FEATURE_UNSUPPORTED
	ErrCodeInternal            int32 = 500000 // ACL_ERROR_INTERNAL_ERROR
	ErrCodeFailure             int32 = 500001 // ACL_ERROR_FAILURE
	ErrCodeRTFailure           int32 = 500003 // ACL_ERROR_RT_FAILURE
	ErrCodeDrvFailure          int32 = 500004 // ACL_ERROR_DRV_FAILURE
	ErrCodeRTParamInvalid      int32 = 107000 // ACL_ERROR_RT_PARAM_INVALID
	ErrCodeRTInvalidDeviceID   int32 = 107001 // ACL_ERROR_RT_INVALID_DEVICEID
	ErrCodeRTContextNull       int32 = 107002 // ACL_ERROR_RT_CONTEXT_NULL
	ErrCodeRTAddrUnaligned     int32 = 107008 // ACL_ERROR_RT_ADDR_UNALIGNED
	ErrCodeRTInvalidHandle     int32 = 107017 // ACL_ERROR_RT_INVALID_HANDLE
	ErrCodeRTFeatureNotSupport int32 = 207000 // ACL_ERROR_RT_FEATURE_NOT_SUPPORT
	ErrCodeRTMemoryAllocation  int32 = 207001 // ACL_ERROR_RT_MEMORY_ALLOCATION: out of memory
	ErrCodeRTMemoryFree        int32 = 207002 // ACL_ERROR_RT_MEMORY_FREE
	ErrCodeRTNoDevice          int32 = 207004 // ACL_ERROR_RT_NO_DEVICE
	ErrCodeRTResourceAllocFail int32 = 207005 // ACL_ERROR_RT_RESOURCE_ALLOC_FAIL
	ErrCodeRTNoPermission      int32 = 207006 // ACL_ERROR_RT_NO_PERMISSION
	ErrCodeRTOverLimit         int32 = 207012 // ACL_ERROR_RT_OVER_LIMIT
	ErrCodeRTDeviceOOM         int32 = 207018 // ACL_ERROR_RT_DEVICE_OOM
	ErrCodeRTInternal          int32 = 507000 // ACL_ERROR_RT_INTERNAL_ERROR
	ErrCodeRTDrvInternal       int32 = 507899 // ACL_ERROR_RT_DRV_INTERNAL_ERROR
)

var codeNames = map[int32]string{
	Success:                    "ACL_SUCCESS",
	ErrCodeInvalidParam:        "ACL_ERROR_INVALID_PARAM",
	ErrCodeUninitialize:        "ACL_ERROR_UNINITIALIZE",
	ErrCodeRepeatInitialize:    "ACL_ERROR_REPEAT_INITIALIZE",
	ErrCodeRepeatFinalize:      "ACL_ERROR_REPEAT_FINALIZE",
	ErrCodeBadAlloc:            "ACL_ERROR_BAD_ALLOC",
	ErrCodeAPINotSupport:       "ACL_ERROR_API_NOT_SUPPORT",
	ErrCodeInvalidDevice:       "ACL_ERROR_INVALID_DEVICE",
	ErrCodeAddressUnaligned:    "ACL_ERROR_MEMORY_ADDRESS_UNALIGNED",
	ErrCodeInvalidResource:     "ACL_ERROR_INVALID_RESOURCE_HANDLE",
	ErrCodeFeatureUnsupported:  "ACL_ERROR_FEATURE_UNSUPPORTED",
	ErrCodeInternal:            "ACL_ERROR_INTERNAL_ERROR",
	ErrCodeFailure:             "ACL_ERROR_FAILURE",
	ErrCodeRTFailure:           "ACL_ERROR_RT_FAILURE",
	ErrCodeDrvFailure:          "ACL_ERROR_DRV_FAILURE",
	ErrCodeRTParamInvalid:      "ACL_ERROR_RT_PARAM_INVALID",
	ErrCodeRTInvalidDeviceID:   "ACL_ERROR_RT_INVALID_DEVICEID",
	ErrCodeRTContextNull:       "ACL_ERROR_RT_CONTEXT_NULL",
	ErrCodeRTAddrUnaligned:     "ACL_ERROR_RT_ADDR_UNALIGNED",
	ErrCodeRTInvalidHandle:     "ACL_ERROR_RT_INVALID_HANDLE",
	ErrCodeRTFeatureNotSupport: "ACL_ERROR_RT_FEATURE_NOT_SUPPORT",
	ErrCodeRTMemoryAllocation:  "ACL_ERROR_RT_MEMORY_ALLOCATION",
	ErrCodeRTMemoryFree:        "ACL_ERROR_RT_MEMORY_FREE",
	ErrCodeRTNoDevice:          "ACL_ERROR_RT_NO_DEVICE",
	ErrCodeRTResourceAllocFail: "ACL_ERROR_RT_RESOURCE_ALLOC_FAIL",
	ErrCodeRTNoPermission:      "ACL_ERROR_RT_NO_PERMISSION",
	ErrCodeRTOverLimit:         "ACL_ERROR_RT_OVER_LIMIT",
	ErrCodeRTDeviceOOM:         "ACL_ERROR_RT_DEVICE_OOM",
	ErrCodeRTInternal:          "ACL_ERROR_RT_INTERNAL_ERROR",
	ErrCodeRTDrvInternal:       "ACL_ERROR_RT_DRV_INTERNAL_ERROR",
}

// CodeName returns the ACL name of an aclError code, such as
// "ACL_ERROR_RT_MEMORY_ALLOCATION" for 207001.
func CodeName(code int32) string {
	if n, ok := codeNames[code]; ok {
		return n
	}
	return fmt.Sprintf("aclError(%d)", code)
}

func sentinelOf(code int32) error {
	switch code {
	case ErrCodeRTMemoryAllocation, ErrCodeRTDeviceOOM, ErrCodeBadAlloc:
		return ErrOutOfMemory
	case ErrCodeInvalidParam, ErrCodeRTParamInvalid, ErrCodeRTAddrUnaligned, ErrCodeAddressUnaligned:
		return ErrInvalidParam
	case ErrCodeRTInvalidHandle, ErrCodeInvalidResource:
		return ErrInvalidHandle
	case ErrCodeRTFeatureNotSupport, ErrCodeAPINotSupport, ErrCodeFeatureUnsupported:
		return ErrNotSupported
	case ErrCodeRTContextNull:
		return ErrNoContext
	case ErrCodeRTInvalidDeviceID, ErrCodeRTNoDevice, ErrCodeInvalidDevice:
		return ErrNoDevice
	}
	return nil
}
