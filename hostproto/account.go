package hostproto

// ValidAccountName is the syntax of an account — an SSH user name, an entry of a
// hostagent's allowed_accounts, ssh_exec's account: the portable POSIX user name characters
// (plus the '$' some systems allow at the end), so a name can never smuggle a path or an
// option.
func ValidAccountName(name string) bool {
	if name == "" || len(name) > 64 || name[0] == '-' {
		return false
	}
	for i, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '.', r == '-':
		case r == '$' && i == len(name)-1:
		default:
			return false
		}
	}
	return true
}
