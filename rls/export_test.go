package rls

// Load reads and parses the configuration at path (a file or a directory,
// as ReadFiles reads it).
func Load(path string) (*Config, error) {
	files, _, err := ReadFiles(path)
	if err != nil {
		return nil, err
	}
	return Parse(files...)
}
