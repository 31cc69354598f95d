// Runs a TF.js graph model in Node.js as a web page does: tf.loadGraphModel through an IOHandler
// that reads model.json and its weight shards, inputs fed by the signature's input keys, outputs
// read by its output keys, on TF.js's pure-JS CPU backend.
//
//   node run.js REQUEST.json
//
// REQUEST: {"model": "path/model.json", "inputs": [{"name", "dtype", "shape", "file"}], "out": "folder",
//           "describe": false}. Each input file holds the tensor's raw little-endian values. The
// script writes out/result.json ({"outputs": [{"name", "dtype", "shape", "file"}], "tfjs", "backend"})
// and each output's raw values beside it. "describe": only the model's signature, no run.
'use strict';
const fs = require('fs');
const path = require('path');
const tf = require('@tensorflow/tfjs');

const ARRAYS = {float32: Float32Array, int32: Int32Array, bool: Uint8Array};

function fileHandler(modelPath) {
  const dir = path.dirname(modelPath);
  return {
    load: async () => {
      const modelJSON = JSON.parse(fs.readFileSync(modelPath, 'utf8'));
      return tf.io.getModelArtifactsForJSON(modelJSON, async (manifest) => {
        const specs = [];
        const buffers = [];
        for (const group of manifest) {
          for (const p of group.paths) buffers.push(fs.readFileSync(path.join(dir, p)));
          specs.push(...group.weights);
        }
        const all = Buffer.concat(buffers);
        return [specs, all.buffer.slice(all.byteOffset, all.byteOffset + all.byteLength)];
      });
    },
  };
}

function read(spec) {
  const bytes = fs.readFileSync(spec.file);
  const Arr = ARRAYS[spec.dtype];
  if (!Arr) throw new Error(`input ${spec.name}: dtype ${spec.dtype} is not one TF.js takes`);
  const values = new Arr(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
  return tf.tensor(spec.dtype === 'bool' ? Array.from(values, (v) => v !== 0) : values, spec.shape, spec.dtype);
}

async function main() {
  const request = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  await tf.setBackend('cpu');
  await tf.ready();
  const model = await tf.loadGraphModel(fileHandler(request.model));
  const signature = model.signature || {};
  const outKeys = Object.keys(signature.outputs || {});
  const result = {tfjs: tf.version.tfjs, backend: tf.getBackend(), inputs: signature.inputs || {}, outputs: []};
  if (!request.describe) {
    const feeds = {};
    for (const spec of request.inputs) feeds[spec.name] = read(spec);
    let got = await model.executeAsync(feeds, outKeys);
    if (!Array.isArray(got)) got = [got];
    for (let i = 0; i < outKeys.length; i++) {
      const t = got[i];
      const data = await t.data();
      const file = path.join(request.out, `out_${i}.bin`);
      const raw = t.dtype === 'bool' ? Uint8Array.from(data, (v) => (v ? 1 : 0)) : data;
      fs.writeFileSync(file, Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength));
      result.outputs.push({name: outKeys[i], dtype: t.dtype, shape: t.shape, file});
    }
  } else {
    result.outputs = signature.outputs || {};
  }
  fs.writeFileSync(path.join(request.out, 'result.json'), JSON.stringify(result));
}

main().catch((e) => {
  process.stderr.write(`tfjs error: ${(e && e.message) || e}\n`);
  process.exit(3);
});
