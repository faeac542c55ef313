package testkit

// Env is a getenv that reads m (nil: an empty environment), for loading a
// service's config in a test without the process's environment.
func Env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}
