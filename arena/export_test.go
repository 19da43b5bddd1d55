package arena

// SetStepHook sets the hook Share and Import call at each of their steps.
func SetStepHook(fn func(step string)) { stepHook = fn }
