package hostagent

import (
	"encoding/pem"
	"os"
)

func writePEMAndSync(f *os.File, block *pem.Block) error {
	if err := pem.Encode(f, block); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
