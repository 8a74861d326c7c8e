"""A Keras model a user might pipeline: a chain of Dense,
LayerNormalization, an activation and a block of MultiHeadAttention."""

import tensorflow as tf

keras = tf.keras
TIME, DIM = 3, 8  # the chain's input: [batch, TIME, DIM]


class AttentionBlock(keras.layers.Layer):
  """x -> norm(x + self-attention(x)), its sublayers named (stable paths)."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name='mha')
    self.norm = keras.layers.LayerNormalization(name='norm')

  def call(self, x):
    return self.norm(x + self.mha(x, x))


class ChainModel(keras.Sequential):
  """Six layers (one without weights), so that K=4 has a layer per cell;
  named, since Keras numbers unnamed layers by how many the process made.
  Outputs [batch, TIME, 4]. A class that builds itself, so it is also a
  factory params text can hold (KerasLayers of the class)."""

  def __init__(self):
    super().__init__([
        keras.Input((TIME, DIM)),
        keras.layers.Dense(16, activation='relu', name='dense'),
        keras.layers.LayerNormalization(name='norm'),
        keras.layers.Dense(DIM, name='dense_1'),
        AttentionBlock(name='block'),
        keras.layers.Activation('gelu', name='gelu'),
        keras.layers.Dense(4, activation='tanh', name='dense_2'),
    ], name='chain')
