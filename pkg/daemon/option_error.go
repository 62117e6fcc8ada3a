package daemon

// OptionError is an Options field (a command-line flag of sealbridged) whose value
// is invalid. Commands map it to their usage exit status (2), so that a usage
// mistake the daemon finds is reported like one the flag parser finds.
type OptionError struct {
	Option string // the flag's name, e.g. "--inbox-relay"
	Err    error  // what is wrong with it
}

func (e *OptionError) Error() string { return e.Option + ": " + e.Err.Error() }
func (e *OptionError) Unwrap() error { return e.Err }
