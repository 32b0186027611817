"""Floor 1, the network: the model (`vision_transformer`), its parts (`layers`, `pos_embed`),
initialisers, timm's features_only (`feature_maps`), the registry of named architectures
(`registry`), one record per family (`families`) and the names of a model's classes."""
